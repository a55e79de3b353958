package epmirror_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/k8s/controllers/epmirror"
	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/udn"
)

var (
	env *testenv.Env
	c   client.Client
	ctl *testenv.Controller
)

// The control plane runs kube-controller-manager's EndpointSlice
// controller: the source slices are the real ones.
func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(testenv.Main(m, testenv.Options{}, func(e *testenv.Env) (manager.Options, error) {
		c = e.Client
		return manager.Options{}, nil
	}, &env, &ctl))
}

// nodeName is the Node the test's pods run on: the EndpointSlice
// controller leaves out pods of nodes it does not know.
const nodeName = "mirror-node"

// runPod creates a pod labelled app=web in ns, waits for its allocation
// (on the namespace's primary UDN, if any) and marks it running and ready
// with defaultIP, its cluster default network address, as a kubelet would.
func runPod(t *testing.T, ns, name, defaultIP string, wantUDN bool) string {
	t.Helper()
	ctx := context.Background()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Image: "busybox",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}}}
	testenv.Create(t, c, p)
	var udnIP string
	if wantUDN {
		testenv.Eventually(t, 30*time.Second, "allocation of "+name, func() error {
			if err := c.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
				return err
			}
			nets, err := podnetworks.Parse(p.Annotations[podnetworks.Annotation])
			if err != nil || len(nets) == 0 {
				return fmt.Errorf("annotation %q: %v", p.Annotations[podnetworks.Annotation], err)
			}
			for _, a := range nets {
				udnIP = strings.Split(a.IPAddresses[0], "/")[0]
			}
			return nil
		})
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: defaultIP, PodIPs: []corev1.PodIP{{IP: defaultIP}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := c.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	return udnIP
}

// mirrors returns the kvnet mirrors of Service svc in ns.
func mirrors(ns, svc string) ([]discoveryv1.EndpointSlice, error) {
	var list discoveryv1.EndpointSliceList
	err := c.List(context.Background(), &list, client.InNamespace(ns),
		client.MatchingLabels{discoveryv1.LabelManagedBy: epmirror.MirrorController, epmirror.ServiceNameLabel: svc})
	return list.Items, err
}

// addresses returns the ready addresses of slices, sorted.
func addresses(slices_ []discoveryv1.EndpointSlice) []string {
	var out []string
	for _, s := range slices_ {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				out = append(out, e.Addresses...)
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestMirror: a Service in a namespace with a primary UDN gets, next to the
// default controller's EndpointSlice (its pods' cluster default network
// addresses), a mirror with the pods' UDN addresses, OVN-Kubernetes'
// labels and annotations, the source's ports and ownership; it follows a
// pod that goes, and goes with the Service. A namespace without a primary
// UDN gets no mirror.
func TestMirror(t *testing.T) {
	ctx := context.Background()
	ns := "mirror-a"
	testenv.Create(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	testenv.Create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{udn.PrimaryNamespaceLabel: ""}}})
	testenv.Create(t, c, &udnv1.UserDefinedNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "udn"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2,
			Layer2: &udnv1.Layer2Config{Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{"10.61.0.0/24"}}}})
	testenv.Eventually(t, 30*time.Second, "NAD", func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "udn"}, &nadv1.NetworkAttachmentDefinition{})
	})
	ip1 := runPod(t, ns, "web-1", "10.244.0.11", true)
	ip2 := runPod(t, ns, "web-2", "10.244.0.12", true)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}}}}
	testenv.Create(t, c, svc)

	want := []string{ip1, ip2}
	slices.Sort(want)
	var mirror discoveryv1.EndpointSlice
	testenv.Eventually(t, 30*time.Second, "a mirror with the UDN addresses", func() error {
		ms, err := mirrors(ns, "web")
		if err != nil {
			return err
		}
		if got := addresses(ms); len(ms) != 1 || !slices.Equal(got, want) {
			return fmt.Errorf("mirrors %d, addresses %v, want %v", len(ms), got, want)
		}
		mirror = ms[0]
		return nil
	})
	var src discoveryv1.EndpointSlice
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: mirror.Annotations[epmirror.SourceAnnotation]}, &src); err != nil {
		t.Fatalf("source of the mirror: %v", err)
	}
	if src.Labels[discoveryv1.LabelManagedBy] != epmirror.DefaultController || !slices.Equal(addresses([]discoveryv1.EndpointSlice{src}), []string{"10.244.0.11", "10.244.0.12"}) {
		t.Errorf("source slice %s: labels %v, addresses %v: want the default controller's, with the default network addresses", src.Name, src.Labels, addresses([]discoveryv1.EndpointSlice{src}))
	}
	if mirror.Annotations[epmirror.NetworkAnnotation] != ns+"_udn" || mirror.Name != epmirror.MirrorName(src.Name) {
		t.Errorf("mirror %s annotations %v", mirror.Name, mirror.Annotations)
	}
	if len(mirror.Ports) != 1 || mirror.Ports[0].Port == nil || *mirror.Ports[0].Port != 8080 {
		t.Errorf("mirror ports %+v, want the source's (8080)", mirror.Ports)
	}
	if len(mirror.OwnerReferences) != 1 || mirror.OwnerReferences[0].Kind != "Service" || mirror.OwnerReferences[0].Name != "web" {
		t.Errorf("mirror owners %+v, want the Service", mirror.OwnerReferences)
	}
	if _, ok := mirror.Labels[discoveryv1.LabelServiceName]; ok {
		t.Errorf("mirror has %s: Service proxies of the default network would use it", discoveryv1.LabelServiceName)
	}

	// A pod goes: its UDN address leaves the mirror.
	if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-2"}}, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "web-2 leaves the mirror", func() error {
		ms, err := mirrors(ns, "web")
		if err != nil {
			return err
		}
		if got := addresses(ms); !slices.Equal(got, []string{ip1}) {
			return fmt.Errorf("addresses %v, want [%s]", got, ip1)
		}
		return nil
	})

	// No primary UDN: the default slice only.
	plain := "mirror-plain"
	testenv.Create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: plain}})
	runPod(t, plain, "web-1", "10.244.0.21", false)
	testenv.Create(t, c, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: plain, Name: "web"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Port: 80}}}})
	testenv.Eventually(t, 30*time.Second, "the default slice of a namespace without a UDN", func() error {
		var list discoveryv1.EndpointSliceList
		if err := c.List(ctx, &list, client.InNamespace(plain), client.MatchingLabels{discoveryv1.LabelServiceName: "web"}); err != nil {
			return err
		}
		if got := addresses(list.Items); !slices.Equal(got, []string{"10.244.0.21"}) {
			return fmt.Errorf("addresses %v", got)
		}
		return nil
	})
	// The mirror of the first namespace proves the controller is running;
	// give it the same time to (wrongly) mirror here.
	time.Sleep(2 * time.Second)
	if ms, err := mirrors(plain, "web"); err != nil || len(ms) != 0 {
		t.Errorf("namespace without a primary UDN: mirrors %d, %v", len(ms), err)
	}

	// The Service goes: its mirror goes with it.
	if err := c.Delete(ctx, svc); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the mirror goes with the Service", func() error {
		ms, err := mirrors(ns, "web")
		if err != nil {
			return err
		}
		if len(ms) != 0 {
			return fmt.Errorf("%d mirrors left", len(ms))
		}
		return nil
	})
}
