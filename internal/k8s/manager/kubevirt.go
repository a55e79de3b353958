package manager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
)

// ErrKubeVirtArrived stops kvnet-controller when KubeVirt's VirtualMachine
// CRD appears while it runs without its VM controllers: its Deployment
// restarts it with them.
var ErrKubeVirtArrived = errors.New("KubeVirt's VirtualMachine CRD appeared: restart to serve VMs")

// kubeVirtGV is the group and version of the KubeVirt kinds kvnet reads.
var kubeVirtGV = schema.GroupVersion{Group: "kubevirt.io", Version: "v1"}

// kubeVirtServed reports whether the API server serves KubeVirt's
// VirtualMachine kind. Without KubeVirt, kvnet serves pods only: the VM
// claims controller, the MAC pool and the VM webhook would fail to start
// on a kind that does not exist.
func kubeVirtServed(mgr ctrl.Manager) (bool, error) {
	_, err := mgr.GetRESTMapper().RESTMapping(kubeVirtGV.WithKind("VirtualMachine").GroupKind(), kubeVirtGV.Version)
	switch {
	case err == nil:
		return true, nil
	case meta.IsNoMatchError(err):
		return false, nil
	}
	return false, fmt.Errorf("find out whether KubeVirt is installed: %w", err)
}

// kubeVirtWatch is a runnable that fails with ErrKubeVirtArrived once the
// API server serves kubevirt.io/v1 virtualmachines.
type kubeVirtWatch struct{ cfg *rest.Config }

// kubeVirtPoll is how often kubeVirtWatch asks.
const kubeVirtPoll = 5 * time.Second

func (w kubeVirtWatch) Start(ctx context.Context) error {
	dc, err := discovery.NewDiscoveryClientForConfig(w.cfg)
	if err != nil {
		return err
	}
	err = wait.PollUntilContextCancel(ctx, kubeVirtPoll, false, func(context.Context) (bool, error) {
		res, err := dc.ServerResourcesForGroupVersion(kubeVirtGV.String())
		if err != nil {
			return false, nil //nolint:nilerr // not served yet (NotFound), or a passing error: ask again
		}
		return slices.ContainsFunc(res.APIResources, func(r metav1.APIResource) bool { return r.Name == "virtualmachines" }), nil
	})
	if ctx.Err() != nil {
		return nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return ErrKubeVirtArrived
}

// NeedLeaderElection reports false: every replica restarts.
func (kubeVirtWatch) NeedLeaderElection() bool { return false }
