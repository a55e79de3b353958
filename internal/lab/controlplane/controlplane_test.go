package controlplane

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A restarted API server serves the same data to the clients (and their
// credentials) issued before the restart, and was really down meanwhile.
func TestRestartAPIServer(t *testing.T) {
	ctx := context.Background()
	cp, err := Start(ctx, Config{NoControllerManager: true})
	if errors.Is(err, ErrBinariesMissing) {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cp.Stop(); err != nil {
			t.Error(err)
		}
	}()
	c, err := client.New(cp.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "before-restart"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	s := cp.Env.ControlPlane.GetAPIServer()
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(ns), &corev1.Namespace{}); err == nil {
		t.Fatal("the API server answered while stopped")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(ns), &corev1.Namespace{}); err != nil {
		t.Fatalf("after the restart, the client issued before it: %v", err)
	}
	// And through the method the chaos run uses.
	if err := cp.RestartAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(ns), &corev1.Namespace{}); err != nil {
		t.Fatalf("after RestartAPIServer: %v", err)
	}
}
