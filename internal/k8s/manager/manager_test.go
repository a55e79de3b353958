package manager_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/lab/controlplane"
	"kvnet.io/kvnet/internal/testenv"
)

// timeout bounds every wait for the system to converge.
const timeout = 30 * time.Second

// TestShippedRBAC runs kvnet-controller as its service account, bound only
// by config/rbac, with leader election on: every API call the controller
// makes must be allowed by the manifests we ship.
func TestShippedRBAC(t *testing.T) {
	env, err := testenv.Start(testenv.Options{NoControllerManager: true})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	ctx := context.Background()
	c := env.Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kvnet-system"}}); err != nil {
		t.Fatal(err)
	}
	if err := controlplane.ApplyFiles(ctx, c, filepath.Join(env.Root, "config", "rbac")); err != nil {
		t.Fatal(err)
	}
	sa, err := env.CP.Env.ControlPlane.AddUser(envtest.User{
		Name:   "system:serviceaccount:kvnet-system:kvnet-controller",
		Groups: []string{"system:serviceaccounts", "system:authenticated"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := manager.New(sa.Config(), manager.Options{
		LeaderElection: true, LeaderElectionNamespace: "kvnet-system", SkipNameValidation: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	defer func() { cancel(); <-done }()

	u := primaryUDN(t, c, "rbac")
	testenv.Eventually(t, timeout, "UDN synced with events", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(u), u); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(u.Status.Conditions, "NetworkCreated") {
			return fmt.Errorf("conditions %+v", u.Status.Conditions)
		}
		var evs corev1.EventList
		if err := c.List(ctx, &evs, client.InNamespace("rbac")); err != nil {
			return err
		}
		if len(evs.Items) == 0 {
			return fmt.Errorf("no events recorded")
		}
		return nil
	})
	if err := c.Delete(ctx, u); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, timeout, "UDN and NAD deleted", func() error {
		err1 := c.Get(ctx, client.ObjectKeyFromObject(u), u)
		err2 := c.Get(ctx, client.ObjectKey{Namespace: "rbac", Name: "net"}, &nadv1.NetworkAttachmentDefinition{})
		if !apierrors.IsNotFound(err1) || !apierrors.IsNotFound(err2) {
			return fmt.Errorf("UDN: %v, NAD: %v", err1, err2)
		}
		return nil
	})
}
