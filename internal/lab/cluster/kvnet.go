package cluster

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// KvnetNamespace is where kvnet install puts kvnet-controller and
// kvnet-node.
const KvnetNamespace = "kvnet-system"

// KvnetInstalled reports whether kvnet install has run on the cluster:
// kvnet-controller's Deployment exists.
func KvnetInstalled(ctx context.Context, cs kubernetes.Interface) (bool, error) {
	_, err := cs.AppsV1().Deployments(KvnetNamespace).Get(ctx, "kvnet-controller", metav1.GetOptions{})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	default:
		return false, fmt.Errorf("get Deployment %s/kvnet-controller: %w", KvnetNamespace, err)
	}
}

// WaitKvnetReady waits until kvnet-controller is available and kvnet-node
// is ready on every node, and returns what is not after timeout.
func WaitKvnetReady(ctx context.Context, cs kubernetes.Interface, timeout time.Duration) error {
	return poll(ctx, timeout, func(ctx context.Context) error {
		d, err := cs.AppsV1().Deployments(KvnetNamespace).Get(ctx, "kvnet-controller", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !deploymentAvailable(d) {
			return fmt.Errorf("kvnet-controller not available: %d of %d replicas", d.Status.AvailableReplicas, d.Status.Replicas)
		}
		ds, err := cs.AppsV1().DaemonSets(KvnetNamespace).Get(ctx, "kvnet-node", metav1.GetOptions{})
		if err != nil {
			return err
		}
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if n := int32(len(nodes.Items)); ds.Status.NumberReady != n {
			return fmt.Errorf("kvnet-node: ready on %d of %d nodes", ds.Status.NumberReady, n)
		}
		return nil
	})
}
