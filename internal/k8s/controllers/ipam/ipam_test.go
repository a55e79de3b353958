package ipam_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
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

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Options{NoControllerManager: true}, func(e *testenv.Env) (manager.Options, error) {
		c = e.Client
		return manager.Options{}, nil
	}, &env, &ctl))
}

func create(t testing.TB, o client.Object) {
	t.Helper()
	testenv.Create(t, c, o)
}

func mkNS(t testing.TB, name string, primary bool) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if primary {
		ns.Labels = map[string]string{"k8s.ovn.org/primary-user-defined-network": ""}
	}
	create(t, ns)
}

// mkUDN creates a Layer2 UDN and waits for its NAD.
func mkUDN(t testing.TB, ns, name string, role udnv1.NetworkRole, persistent bool, subnets ...udnv1.CIDR) {
	t.Helper()
	u := &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2,
			Layer2: &udnv1.Layer2Config{Role: role, Subnets: subnets}},
	}
	if persistent {
		u.Spec.Layer2.IPAM = &udnv1.IPAMConfig{Lifecycle: udnv1.IPAMLifecyclePersistent}
	}
	create(t, u)
	testenv.Eventually(t, 30*time.Second, "NAD "+ns+"/"+name, func() error {
		return c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &nadv1.NetworkAttachmentDefinition{})
	})
}

func mkClaim(t testing.TB, ns, name, network string) *ipamclaimv1alpha1.IPAMClaim {
	t.Helper()
	cl := &ipamclaimv1alpha1.IPAMClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       ipamclaimv1alpha1.IPAMClaimSpec{Network: network},
	}
	create(t, cl)
	return cl
}

func mkPod(ns, name string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
}

func secondary(nad, claim string) map[string]string {
	el := fmt.Sprintf(`{"name":%q`, nad)
	if claim != "" {
		el += fmt.Sprintf(`,"ipam-claim-reference":%q`, claim)
	}
	return map[string]string{"k8s.v1.cni.cncf.io/networks": "[" + el + "}]"}
}

// waitAnnotated waits for a pod's kvnet.io/pod-networks and returns it.
func waitAnnotated(t testing.TB, ns, name string) podnetworks.Networks {
	t.Helper()
	var nets podnetworks.Networks
	testenv.Eventually(t, 30*time.Second, "pod "+ns+"/"+name+" annotated", func() error {
		var p corev1.Pod
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
			return err
		}
		v, ok := p.Annotations[podnetworks.Annotation]
		if !ok {
			return fmt.Errorf("no %s annotation", podnetworks.Annotation)
		}
		var err error
		nets, err = podnetworks.Parse(v)
		return err
	})
	return nets
}

// waitEvent waits for an event on the named object with reason and a
// message containing msg.
func waitEvent(t testing.TB, ns, name, reason, msg string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("event %s on %s/%s", reason, ns, name), func() error {
		var evs corev1.EventList
		if err := c.List(context.Background(), &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		var seen []string
		for _, e := range evs.Items {
			if e.InvolvedObject.Name != name {
				continue
			}
			if e.Reason == reason && strings.Contains(e.Message, msg) {
				return nil
			}
			seen = append(seen, e.Reason+": "+e.Message)
		}
		return fmt.Errorf("events seen: %v", seen)
	})
}

func claimStatus(t testing.TB, ns, name string) ipamclaimv1alpha1.IPAMClaimStatus {
	t.Helper()
	var cl ipamclaimv1alpha1.IPAMClaim
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &cl); err != nil {
		t.Fatal(err)
	}
	return cl.Status
}

func TestPrimaryPodAnnotated(t *testing.T) {
	mkNS(t, "primary", true)
	mkUDN(t, "primary", "tenant", udnv1.NetworkRolePrimary, false, "10.10.0.0/24", "fd10::/64")
	create(t, mkPod("primary", "web", nil))
	a, ok := waitAnnotated(t, "primary", "web")["primary/tenant"]
	if !ok {
		t.Fatal("no attachment for primary/tenant")
	}
	if a.Role != "primary" || a.Network != "primary_tenant" || len(a.IPAddresses) != 2 {
		t.Fatalf("attachment %+v", a)
	}
	v4 := netip.MustParsePrefix(a.IPAddresses[0])
	if !netip.MustParsePrefix("10.10.0.0/24").Contains(v4.Addr()) || v4.Bits() != 24 {
		t.Fatalf("IPv4 %s not in 10.10.0.0/24", v4)
	}
	if v4.Addr() == netip.MustParseAddr("10.10.0.1") || v4.Addr() == netip.MustParseAddr("10.10.0.2") {
		t.Fatalf("got the gateway or management address %s", v4)
	}
	if len(a.GatewayIPs) != 2 || a.GatewayIPs[0] != "10.10.0.1" || a.GatewayIPs[1] != "fd10::1" {
		t.Fatalf("gateways %v", a.GatewayIPs)
	}
	if len(a.Routes) != 2 || a.Routes[0].Dest != "0.0.0.0/0" || a.Routes[0].NextHop != "10.10.0.1" {
		t.Fatalf("routes %+v", a.Routes)
	}
	b := v4.Addr().As4()
	if want := fmt.Sprintf("0a:58:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3]); a.MACAddress != want {
		t.Fatalf("MAC %s, want %s", a.MACAddress, want)
	}
}

func TestClaimSurvivesPodRecreation(t *testing.T) {
	ctx := context.Background()
	mkNS(t, "stopstart", false)
	mkUDN(t, "stopstart", "blue", udnv1.NetworkRoleSecondary, true, "192.168.50.0/24")
	mkClaim(t, "stopstart", "vm1.blue", "stopstart_blue")

	create(t, mkPod("stopstart", "virt-launcher-vm1-aaaaa", secondary("blue", "vm1.blue")))
	first := waitAnnotated(t, "stopstart", "virt-launcher-vm1-aaaaa")["stopstart/blue"]
	st := claimStatus(t, "stopstart", "vm1.blue")
	if len(st.IPs) != 1 || st.IPs[0] != first.IPAddresses[0] {
		t.Fatalf("claim IPs %v, pod IPs %v", st.IPs, first.IPAddresses)
	}
	if st.OwnerPod == nil || st.OwnerPod.Name != "virt-launcher-vm1-aaaaa" {
		t.Fatalf("ownerPod %+v", st.OwnerPod)
	}
	cond := meta.FindStatusCondition(st.Conditions, "IPsAllocated")
	if cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != "SuccessfulAllocation" || cond.Message != "IP addresses successfully allocated" {
		t.Fatalf("condition %+v", cond)
	}
	if first.IPAMClaim != "vm1.blue" {
		t.Fatalf("annotation names claim %q", first.IPAMClaim)
	}

	// VM stop: the pod goes; a pod without a claim must not get the IP.
	if err := c.Delete(ctx, mkPod("stopstart", "virt-launcher-vm1-aaaaa", nil)); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		name := fmt.Sprintf("other-%d", i)
		create(t, mkPod("stopstart", name, secondary("blue", "")))
		if got := waitAnnotated(t, "stopstart", name)["stopstart/blue"]; got.IPAddresses[0] == first.IPAddresses[0] {
			t.Fatalf("pod %s got the stopped VM's IP %s", name, got.IPAddresses[0])
		}
	}
	// VM start: a new launcher pod gets the same IP and MAC.
	create(t, mkPod("stopstart", "virt-launcher-vm1-bbbbb", secondary("blue", "vm1.blue")))
	second := waitAnnotated(t, "stopstart", "virt-launcher-vm1-bbbbb")["stopstart/blue"]
	if second.IPAddresses[0] != first.IPAddresses[0] || second.MACAddress != first.MACAddress {
		t.Fatalf("after restart %v/%s, before %v/%s", second.IPAddresses, second.MACAddress, first.IPAddresses, first.MACAddress)
	}
	testenv.Eventually(t, 10*time.Second, "ownerPod follows", func() error {
		if st := claimStatus(t, "stopstart", "vm1.blue"); st.OwnerPod == nil || st.OwnerPod.Name != "virt-launcher-vm1-bbbbb" {
			return fmt.Errorf("ownerPod %+v", st.OwnerPod)
		}
		return nil
	})
}

func launcher(ns, name, vm string, annotations map[string]string) *corev1.Pod {
	p := mkPod(ns, name, annotations)
	p.Labels = map[string]string{"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": vm}
	p.Annotations["kubevirt.io/domain"] = vm
	return p
}

func TestMigrationPodsShareIPs(t *testing.T) {
	mkNS(t, "migrate", true)
	mkUDN(t, "migrate", "l2", udnv1.NetworkRolePrimary, true, "10.20.0.0/16")
	mkClaim(t, "migrate", "vm-a.pod", "migrate_l2")

	defaultNet := `[{"name":"default","namespace":"ovn-kubernetes","ipam-claim-reference":"vm-a.pod"}]`
	create(t, launcher("migrate", "virt-launcher-vm-a-src", "vm-a", map[string]string{"v1.multus-cni.io/default-network": defaultNet}))
	src := waitAnnotated(t, "migrate", "virt-launcher-vm-a-src")["migrate/l2"]
	time.Sleep(1100 * time.Millisecond) // creation timestamps have 1 s resolution
	// The target uses the legacy annotation, which must work the same.
	create(t, launcher("migrate", "virt-launcher-vm-a-dst", "vm-a", map[string]string{"k8s.ovn.org/primary-udn-ipamclaim": "vm-a.pod"}))
	dst := waitAnnotated(t, "migrate", "virt-launcher-vm-a-dst")["migrate/l2"]
	if src.IPAddresses[0] != dst.IPAddresses[0] || src.MACAddress != dst.MACAddress {
		t.Fatalf("source %v %s, target %v %s", src.IPAddresses, src.MACAddress, dst.IPAddresses, dst.MACAddress)
	}
	testenv.Eventually(t, 10*time.Second, "claim owned by the target", func() error {
		if st := claimStatus(t, "migrate", "vm-a.pod"); st.OwnerPod == nil || st.OwnerPod.Name != "virt-launcher-vm-a-dst" {
			return fmt.Errorf("ownerPod %+v", st.OwnerPod)
		}
		return nil
	})
}

func TestClaimDeletionFreesIPAndExhaustion(t *testing.T) {
	ctx := context.Background()
	mkNS(t, "small", false)
	// A /29 secondary network: .1 to .6 usable.
	mkUDN(t, "small", "tiny", udnv1.NetworkRoleSecondary, true, "10.30.0.0/29")
	mkClaim(t, "small", "vm.tiny", "small_tiny")
	create(t, mkPod("small", "vm-pod", secondary("tiny", "vm.tiny")))
	held := waitAnnotated(t, "small", "vm-pod")["small/tiny"].IPAddresses[0]
	for i := range 5 {
		name := fmt.Sprintf("fill-%d", i)
		create(t, mkPod("small", name, secondary("tiny", "")))
		waitAnnotated(t, "small", name)
	}
	// Full: a claim asking now fails visibly.
	mkClaim(t, "small", "late.tiny", "small_tiny")
	create(t, mkPod("small", "late", secondary("tiny", "late.tiny")))
	waitEvent(t, "small", "late", "IPAllocationFailed", "subnet address pool exhausted")
	testenv.Eventually(t, 10*time.Second, "exhaustion on the claim", func() error {
		cond := meta.FindStatusCondition(claimStatus(t, "small", "late.tiny").Conditions, "IPsAllocated")
		if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != "SubnetExhausted" {
			return fmt.Errorf("condition %+v", cond)
		}
		return nil
	})
	// The network's NAD is marked while pods wait (kvnet-node reports
	// it to the runtime's CNI STATUS), and the mark goes once none does.
	exhaustedMark := func(want bool) func() error {
		return func() error {
			var nad nadv1.NetworkAttachmentDefinition
			if err := c.Get(ctx, client.ObjectKey{Namespace: "small", Name: "tiny"}, &nad); err != nil {
				return err
			}
			if got := nad.Annotations[udn.PoolExhaustedAnnotation] == "true"; got != want {
				return fmt.Errorf("NAD small/tiny annotations %v, want %s marked %v", nad.Annotations, udn.PoolExhaustedAnnotation, want)
			}
			return nil
		}
	}
	testenv.Eventually(t, 10*time.Second, "NAD marked exhausted", exhaustedMark(true))

	// The VM's pod going does not free its IP; deleting the claim does.
	if err := c.Delete(ctx, mkPod("small", "vm-pod", nil)); err != nil {
		t.Fatal(err)
	}
	create(t, mkPod("small", "still-full", secondary("tiny", "")))
	waitEvent(t, "small", "still-full", "IPAllocationFailed", "subnet address pool exhausted")
	if err := c.Delete(ctx, &ipamclaimv1alpha1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "small", Name: "vm.tiny"}}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 45*time.Second, "freed IP handed out", func() error {
		var p corev1.Pod
		if err := c.Get(ctx, client.ObjectKey{Namespace: "small", Name: "late"}, &p); err != nil {
			return err
		}
		var q corev1.Pod
		if err := c.Get(ctx, client.ObjectKey{Namespace: "small", Name: "still-full"}, &q); err != nil {
			return err
		}
		for _, pod := range []corev1.Pod{p, q} {
			if v, ok := pod.Annotations[podnetworks.Annotation]; ok {
				n, err := podnetworks.Parse(v)
				if err != nil {
					return err
				}
				if got := n["small/tiny"].IPAddresses[0]; got != held {
					return fmt.Errorf("pod %s got %s, but only %s was freed", pod.Name, got, held)
				}
				return nil
			}
		}
		return fmt.Errorf("neither waiting pod got the freed IP yet")
	})
	for _, name := range []string{"late", "still-full"} {
		if err := c.Delete(ctx, mkPod("small", name, nil)); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 10*time.Second, "NAD exhaustion mark removed", exhaustedMark(false))
}

func TestInvalidRequests(t *testing.T) {
	mkNS(t, "invalid", false)
	mkUDN(t, "invalid", "net", udnv1.NetworkRoleSecondary, true, "10.40.0.0/24")
	mkUDN(t, "invalid", "plain", udnv1.NetworkRoleSecondary, false, "10.41.0.0/24")
	mkClaim(t, "invalid", "c1", "invalid_net")

	create(t, mkPod("invalid", "both", map[string]string{"k8s.v1.cni.cncf.io/networks": `[{"name":"net","ips":["10.40.0.9"],"ipam-claim-reference":"c1"}]`}))
	waitEvent(t, "invalid", "both", "InvalidNetworkRequest", "ips and ipam-claim-reference cannot be used together")

	create(t, mkPod("invalid", "static", map[string]string{"k8s.v1.cni.cncf.io/networks": `[{"name":"net","ips":["10.40.0.77/24"],"mac":"02:11:22:33:44:55"}]`}))
	a := waitAnnotated(t, "invalid", "static")["invalid/net"]
	if a.IPAddresses[0] != "10.40.0.77/24" || a.MACAddress != "02:11:22:33:44:55" {
		t.Fatalf("static request got %v %s", a.IPAddresses, a.MACAddress)
	}
	create(t, mkPod("invalid", "dup-ip", map[string]string{"k8s.v1.cni.cncf.io/networks": `[{"name":"net","ips":["10.40.0.77"]}]`}))
	waitEvent(t, "invalid", "dup-ip", "IPAllocationFailed", "provided IP is already allocated")
	create(t, mkPod("invalid", "dup-mac", map[string]string{"k8s.v1.cni.cncf.io/networks": `[{"name":"net","mac":"02:11:22:33:44:55"}]`}))
	waitEvent(t, "invalid", "dup-mac", "IPAllocationFailed", "MAC address is already allocated")
	create(t, mkPod("invalid", "outside", map[string]string{"k8s.v1.cni.cncf.io/networks": `[{"name":"net","ips":["10.99.0.1"]}]`}))
	waitEvent(t, "invalid", "outside", "IPAllocationFailed", "10.99.0.1")

	// A claim on a network without persistent IPs is ignored, with an event.
	create(t, mkPod("invalid", "ignored-claim", secondary("plain", "c1")))
	waitEvent(t, "invalid", "ignored-claim", "IPAMClaimIgnored", `referencing an IPAMClaim on network "invalid_plain" which does not honor it`)
	if a := waitAnnotated(t, "invalid", "ignored-claim")["invalid/plain"]; a.IPAMClaim != "" {
		t.Fatalf("claim recorded on a network that does not honour claims: %+v", a)
	}

	// A missing claim: event, then served once the claim appears.
	create(t, mkPod("invalid", "early", secondary("net", "later")))
	waitEvent(t, "invalid", "early", "IPAMClaimNotFound", "invalid/later")
	mkClaim(t, "invalid", "later", "invalid_net")
	waitAnnotated(t, "invalid", "early")
}

func TestKvnetIPAMUnderBridgeNAD(t *testing.T) {
	mkNS(t, "mignet", false)
	create(t, &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: "mignet", Name: "migration"},
		Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: `{"cniVersion":"1.0.0","type":"bridge","name":"migration","bridge":"br-mig",` +
			`"ipam":{"type":"kvnet-ipam","subnets":"10.200.0.0/24","excludeSubnets":"10.200.0.0/28","gatewayIPs":"10.200.0.254"}}`},
	})
	create(t, mkPod("mignet", "handler", map[string]string{"k8s.v1.cni.cncf.io/networks": "migration@migration0"}))
	a := waitAnnotated(t, "mignet", "handler")["mignet/migration"]
	ip := netip.MustParsePrefix(a.IPAddresses[0]).Addr()
	if !netip.MustParsePrefix("10.200.0.0/24").Contains(ip) || netip.MustParsePrefix("10.200.0.0/28").Contains(ip) || ip.String() == "10.200.0.254" {
		t.Fatalf("got %s: outside the subnet or excluded", ip)
	}
	if a.Role != "secondary" || len(a.Routes) != 0 {
		t.Fatalf("attachment %+v", a)
	}
}

func TestPodDeletionFreesIP(t *testing.T) {
	ctx := context.Background()
	mkNS(t, "churn", false)
	mkUDN(t, "churn", "n", udnv1.NetworkRoleSecondary, false, "10.50.0.0/29")
	for i := range 6 {
		create(t, mkPod("churn", fmt.Sprintf("p%d", i), secondary("n", "")))
		waitAnnotated(t, "churn", fmt.Sprintf("p%d", i))
	}
	gone := waitAnnotated(t, "churn", "p3")["churn/n"].IPAddresses[0]
	if err := c.Delete(ctx, mkPod("churn", "p3", nil)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "p3 gone", func() error {
		err := c.Get(ctx, client.ObjectKey{Namespace: "churn", Name: "p3"}, &corev1.Pod{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %v", err)
	})
	// The release is asynchronous; retry creating until a pod gets the IP.
	testenv.Eventually(t, 30*time.Second, "freed IP reused", func() error {
		name := fmt.Sprintf("new-%d", time.Now().UnixNano())
		create(t, mkPod("churn", name, secondary("n", "")))
		time.Sleep(300 * time.Millisecond)
		var p corev1.Pod
		if err := c.Get(ctx, client.ObjectKey{Namespace: "churn", Name: name}, &p); err != nil {
			return err
		}
		v, ok := p.Annotations[podnetworks.Annotation]
		_ = c.Delete(ctx, &p)
		if !ok {
			return fmt.Errorf("not annotated")
		}
		n, err := podnetworks.Parse(v)
		if err != nil {
			return err
		}
		if got := n["churn/n"].IPAddresses[0]; got != gone {
			return fmt.Errorf("got %s, want the freed %s", got, gone)
		}
		return nil
	})
}

// allAnnotated waits until every pod of the namespace is annotated and
// returns NAD-key -> IP -> pod, failing on any duplicate IP or MAC.
func allAnnotated(t testing.TB, ns string, want int) map[string]string {
	t.Helper()
	ips := map[string]string{}
	testenv.Eventually(t, 120*time.Second, fmt.Sprintf("%d pods annotated in %s", want, ns), func() error {
		var pods corev1.PodList
		if err := c.List(context.Background(), &pods, client.InNamespace(ns)); err != nil {
			return err
		}
		done := 0
		ips = map[string]string{}
		macs := map[string]string{}
		for _, p := range pods.Items {
			v, ok := p.Annotations[podnetworks.Annotation]
			if !ok {
				continue
			}
			done++
			n, err := podnetworks.Parse(v)
			if err != nil {
				return err
			}
			for _, a := range n {
				for _, ip := range a.IPAddresses {
					if other, dup := ips[ip]; dup {
						t.Fatalf("duplicate IP %s: %s and %s", ip, other, p.Name)
					}
					ips[ip] = p.Name
				}
				if other, dup := macs[a.MACAddress]; dup {
					t.Fatalf("duplicate MAC %s: %s and %s", a.MACAddress, other, p.Name)
				}
				macs[a.MACAddress] = p.Name
			}
		}
		if done != want {
			return fmt.Errorf("%d of %d annotated", done, want)
		}
		return nil
	})
	return ips
}

func createPods(t testing.TB, ns string, n int, annotations func(i int) map[string]string) {
	t.Helper()
	if err := createPodRange(ns, 0, n, annotations); err != nil {
		t.Fatal(err)
	}
}

// createPodRange creates pods pod-<from> to pod-<to-1>, 32 at a time, and
// returns every error. It calls no testing.T method, so it may run on any
// goroutine.
func createPodRange(ns string, from, to int, annotations func(i int) map[string]string) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	sem := make(chan struct{}, 32)
	for i := from; i < to; i++ {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := c.Create(context.Background(), mkPod(ns, fmt.Sprintf("pod-%04d", i), annotations(i))); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// annotations returns pod name -> kvnet.io/pod-networks of the annotated
// pods of ns, and how many pods ns has.
func annotations(ns string) (map[string]string, int, error) {
	var list corev1.PodList
	if err := c.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		return nil, 0, err
	}
	out := map[string]string{}
	for _, p := range list.Items {
		if v, ok := p.Annotations[podnetworks.Annotation]; ok {
			out[p.Name] = v
		}
	}
	return out, len(list.Items), nil
}

func TestThousandPodsNoDuplicates(t *testing.T) {
	mkNS(t, "thousand", true)
	mkUDN(t, "thousand", "big", udnv1.NetworkRolePrimary, false, "10.60.0.0/16")
	createPods(t, "thousand", 1000, func(int) map[string]string { return nil })
	if ips := allAnnotated(t, "thousand", 1000); len(ips) != 1000 {
		t.Fatalf("%d distinct IPs for 1000 pods", len(ips))
	}
}

// TestRestartMidBurst restarts the controller inside a burst of pods,
// half of them with claims: once restartAt pods are allocated (as the API
// shows), while the rest are still being created and served. The last
// late pods of the burst are only created once the new controller runs, so
// the restart lands inside the burst however fast the old controller is.
// Nothing handed out before the restart may change, and no IP or MAC may be
// handed out twice.
func TestRestartMidBurst(t *testing.T) {
	mkNS(t, "burst", false)
	mkUDN(t, "burst", "n", udnv1.NetworkRoleSecondary, true, "10.70.0.0/16")
	const pods, restartAt, late = 400, 100, 100
	for i := range pods / 2 {
		mkClaim(t, "burst", fmt.Sprintf("vm%d.n", i), "burst_n")
	}
	ann := func(i int) map[string]string {
		if i%2 == 0 {
			return secondary("n", fmt.Sprintf("vm%d.n", i/2))
		}
		return secondary("n", "")
	}
	restarted := make(chan struct{})
	created := make(chan error, 2)
	go func() { created <- createPodRange("burst", 0, pods-late, ann) }()
	go func() {
		<-restarted
		created <- createPodRange("burst", pods-late, pods, ann)
	}()
	// Whatever happens below, let the creators finish before returning.
	resume := sync.OnceFunc(func() { close(restarted) })
	waited := 0
	defer func() {
		resume()
		for ; waited < 2; waited++ {
			<-created
		}
	}()

	testenv.Eventually(t, 120*time.Second, fmt.Sprintf("%d pods allocated before the restart", restartAt), func() error {
		got, _, err := annotations("burst")
		if err != nil {
			return err
		}
		if len(got) < restartAt {
			return fmt.Errorf("%d allocated", len(got))
		}
		return nil
	})
	ctl.Stop()
	defer ctl.Start(t) // no-op unless the test fails before restarting it
	// The old controller is stopped: this is all it handed out.
	before, existing, err := annotations("burst")
	if err != nil {
		t.Fatal(err)
	}
	ctl.Start(t)
	resume()
	for waited < 2 {
		err := <-created
		waited++
		if err != nil {
			t.Fatalf("create pods: %v", err)
		}
	}
	// Inside the burst: the old controller served some pods, the new one
	// the others (at least the late ones, created after the restart).
	if len(before) < restartAt || len(before) > pods-late {
		t.Fatalf("restart with %d of %d pods allocated, want %d to %d", len(before), pods, restartAt, pods-late)
	}
	t.Logf("restart with %d of %d pods allocated, %d created and waiting", len(before), pods, existing-len(before))
	allAnnotated(t, "burst", pods)
	var list corev1.PodList
	if err := c.List(context.Background(), &list, client.InNamespace("burst")); err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		if old, ok := before[p.Name]; ok && p.Annotations[podnetworks.Annotation] != old {
			t.Errorf("pod %s changed across the restart: %s -> %s", p.Name, old, p.Annotations[podnetworks.Annotation])
		}
	}
	// Every claim holds exactly its pod's IP.
	for i := range pods / 2 {
		st := claimStatus(t, "burst", fmt.Sprintf("vm%d.n", i))
		var p corev1.Pod
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: "burst", Name: fmt.Sprintf("pod-%04d", 2*i)}, &p); err != nil {
			t.Fatal(err)
		}
		n, _ := podnetworks.Parse(p.Annotations[podnetworks.Annotation])
		if len(st.IPs) != 1 || st.IPs[0] != n["burst/n"].IPAddresses[0] {
			t.Errorf("claim vm%d.n holds %v, its pod has %v", i, st.IPs, n["burst/n"].IPAddresses)
		}
	}
}

// A claim left behind in a namespace that is gone (the namespace controller
// finished without deleting it, as can happen across an API server
// restart) is deleted by kvnet-controller, so its IPs do not stay held;
// while its namespace exists, even terminating, it is left alone.
func TestClaimOfDeletedNamespaceDeleted(t *testing.T) {
	ctx := context.Background()
	const ns = "orphaned"
	mkNS(t, ns, false)
	mkUDN(t, ns, "blue", udnv1.NetworkRoleSecondary, true, "192.168.77.0/24")
	mkClaim(t, ns, "vm1.blue", ns+"_blue")
	// A claim no pod ever used holds no IPs, and is left behind all the
	// same.
	mkClaim(t, ns, "spare.blue", ns+"_blue")
	create(t, mkPod(ns, "virt-launcher-vm1-aaaaa", secondary("blue", "vm1.blue")))
	waitAnnotated(t, ns, "virt-launcher-vm1-aaaaa")
	if st := claimStatus(t, ns, "vm1.blue"); len(st.IPs) != 1 {
		t.Fatalf("claim IPs %v", st.IPs)
	}
	// No kube-controller-manager here: the namespace stays Terminating
	// with its content until it is finalized by hand.
	nsObj := &corev1.Namespace{}
	if err := c.Get(ctx, client.ObjectKey{Name: ns}, nsObj); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, nsObj); err != nil {
		t.Fatal(err)
	}
	// A terminating namespace keeps its claim (the namespace controller,
	// not kvnet, deletes it).
	claimStatus(t, ns, "vm1.blue")
	testenv.FinalizeNamespace(t, c, ns)
	testenv.Eventually(t, 30*time.Second, "orphaned claims deleted", func() error {
		for _, name := range []string{"vm1.blue", "spare.blue"} {
			err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &ipamclaimv1alpha1.IPAMClaim{})
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("claim %s still there (%v)", name, err)
			}
		}
		return nil
	})
}

// TestPodsLabelledWithTheirNetworks: an allocated pod carries one label
// per network it is attached to (kvnet-node watches a network's pods by
// it); a pod whose labels are removed gets them back, and so does a pod
// annotated by a kvnet before the labels (an upgrade).
func TestPodsLabelledWithTheirNetworks(t *testing.T) {
	ctx := context.Background()
	mkNS(t, "labels", true)
	mkUDN(t, "labels", "tenant", udnv1.NetworkRolePrimary, false, "10.12.0.0/24")
	mkUDN(t, "labels", "side", udnv1.NetworkRoleSecondary, false, "10.13.0.0/24")
	create(t, mkPod("labels", "web", secondary("side", "")))
	nets := waitAnnotated(t, "labels", "web")
	want := map[string]string{podnetworks.NetworkLabel("labels_tenant"): "", podnetworks.NetworkLabel("labels_side"): ""}
	if len(nets) != 2 || !podnetworks.HasLabels(nets.Labels(), want) {
		t.Fatalf("attachments %v: want labels_tenant and labels_side", nets)
	}
	labelled := func(name string) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, "pod labels/"+name+" labelled with its networks", func() error {
			var p corev1.Pod
			if err := c.Get(ctx, client.ObjectKey{Namespace: "labels", Name: name}, &p); err != nil {
				return err
			}
			if !podnetworks.HasLabels(p.Labels, want) {
				return fmt.Errorf("labels %v, want %v among them", p.Labels, want)
			}
			return nil
		})
	}
	labelled("web")

	// Somebody removes them.
	var p corev1.Pod
	if err := c.Get(ctx, client.ObjectKey{Namespace: "labels", Name: "web"}, &p); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(p.DeepCopy())
	for k := range want {
		delete(p.Labels, k)
	}
	if err := c.Patch(ctx, &p, patch); err != nil {
		t.Fatal(err)
	}
	labelled("web")

	// A pod annotated before kvnet labelled pods: created with the
	// annotation (as the upgraded controller finds it), without labels.
	old := mkPod("labels", "old", secondary("side", ""))
	value, err := nets.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	old.Annotations[podnetworks.Annotation] = value
	create(t, old)
	labelled("old")
}
