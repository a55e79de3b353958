package manager_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/lab/controlplane"
	"kvnet.io/kvnet/internal/testenv"
)

// TestWithoutKubeVirt: on a cluster without KubeVirt's CRDs kvnet-controller
// runs (webhooks, MAC pool and all) and serves pods' networks: it becomes
// ready and reconciles a UDN. When KubeVirt's VirtualMachine CRD appears
// it stops with an error saying so, for its Deployment to restart it with
// the VM controllers.
func TestWithoutKubeVirt(t *testing.T) {
	env, err := testenv.Start(testenv.Options{NoControllerManager: true, NoKubeVirtCRDs: true})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	ctx := context.Background()
	c := env.Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kvnet-system"}}); err != nil {
		t.Fatal(err)
	}
	w := manager.DefaultWebhookOptions()
	w.Host, w.Port, w.IPs = "127.0.0.1", testenv.FreePort(t), []net.IP{net.IPv4(127, 0, 0, 1)}
	opts := manager.DefaultOptions()
	opts.Webhook, opts.SkipNameValidation, opts.MetricsAddr, opts.LeaderElection = &w, true, "0", false
	opts.ProbeAddr = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	mgr, err := manager.New(env.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()

	u := primaryUDN(t, c, "nokv")
	testenv.Eventually(t, timeout, "ready and the UDN reconciled without KubeVirt", func() error {
		select {
		case err := <-done:
			t.Fatalf("kvnet-controller stopped without KubeVirt: %v", err)
		default:
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(u), u); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(u.Status.Conditions, "NetworkCreated") {
			return fmt.Errorf("conditions %+v", u.Status.Conditions)
		}
		return httpOK("http://" + opts.ProbeAddr + "/readyz")
	})

	// KubeVirt arrives.
	crds, err := controlplane.KvnetCRDs()
	if err != nil {
		t.Fatal(err)
	}
	sch := runtime.NewScheme()
	if err := apiextensionsv1.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	cc, err := client.New(env.Config, client.Options{Scheme: sch})
	if err != nil {
		t.Fatal(err)
	}
	for _, crd := range crds {
		if crd.Spec.Group == "kubevirt.io" {
			if err := cc.Create(ctx, crd.DeepCopy()); err != nil {
				t.Fatal(err)
			}
		}
	}
	select {
	case err := <-done:
		if err == nil || !errors.Is(err, manager.ErrKubeVirtArrived) || !strings.Contains(err.Error(), "VirtualMachine") {
			t.Fatalf("kvnet-controller stopped with %v, want ErrKubeVirtArrived", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("kvnet-controller went on without its VM controllers after KubeVirt's CRDs appeared")
	}
}

// httpOK returns nil when GET url answers 200.
func httpOK(url string) error {
	resp, err := http.Get(url) //nolint:gosec,noctx // a test's local probe
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// primaryUDN creates namespace ns labelled for a primary network and a
// primary Layer2 UDN "net" in it, and returns the UDN.
func primaryUDN(t *testing.T, c client.Client, ns string) *udnv1.UserDefinedNetwork {
	t.Helper()
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"k8s.ovn.org/primary-user-defined-network": ""}}}); err != nil {
		t.Fatal(err)
	}
	u := &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "net"},
		Spec:       udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{"10.0.0.0/24"}}},
	}
	if err := c.Create(ctx, u); err != nil {
		t.Fatal(err)
	}
	return u
}
