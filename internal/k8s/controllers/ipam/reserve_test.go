package ipam_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/testenv"
)

// reserveRecord returns the addresses the restart reserve's record of
// network lists, once it lists want of them.
func reserveRecord(t testing.TB, ns, network string, want int) []string {
	t.Helper()
	var got []string
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("the restart reserve of %s listing %d sets", network, want), func() error {
		var list corev1.ConfigMapList
		if err := c.List(context.Background(), &list, client.InNamespace(ns), client.HasLabels{"ipam.kvnet.io/restart-reserve"}); err != nil {
			return err
		}
		for _, cm := range list.Items {
			if cm.Data["network"] != network {
				continue
			}
			got = nil
			if v := cm.Data["addresses"]; v != "" {
				got = strings.Split(v, "\n")
			}
			if len(got) != want {
				return fmt.Errorf("lists %d: %q", len(got), got)
			}
			return nil
		}
		return fmt.Errorf("no record among %d ConfigMaps", len(list.Items))
	})
	return got
}

// runWith stops the package's controller and runs one with opts until the
// returned stop; the package's controller is started again at the end of
// the test.
func runWith(t *testing.T, opts manager.Options) (stop func()) {
	t.Helper()
	return start(t, opts, env.RunController)
}

// start stops the package's controller, starts one with opts through run
// (Env.RunController or RunStandby) and returns its stop, which the
// test's cleanup calls too; the package's controller is started again at
// the end of the test.
func start(t *testing.T, opts manager.Options, run func(manager.Options) (func(), error)) (stop func()) {
	t.Helper()
	ctl.Stop()
	t.Cleanup(func() { ctl.Start(t) })
	s, err := run(opts)
	if err != nil {
		t.Fatal(err)
	}
	stop = sync.OnceFunc(s)
	t.Cleanup(stop)
	return stop
}

// A restarted controller with the restart reserve serves a new pod from
// its predecessor's record before it has read the claims and pods (the
// rebuild is held); what a claim or a static request asks for waits for
// the rebuild, and a static request for a reserved address takes it out
// of the reserve. No address is handed out twice.
func TestRestartReserve(t *testing.T) {
	ctx := context.Background()
	const ns, records = "reserve", "reserve-records"
	mkNS(t, ns, false)
	mkNS(t, records, false)
	mkUDN(t, ns, "net", udnv1.NetworkRoleSecondary, true, "10.77.0.0/24")
	network := ns + "_net"

	opts := ctl.Options()
	opts.RestartReserve, opts.Namespace = 4, records
	stop := runWith(t, opts)
	for i := range 3 {
		create(t, mkPod(ns, fmt.Sprintf("before-%d", i), secondary("net", "")))
	}
	mkClaim(t, ns, "vm1.net", network)
	create(t, mkPod(ns, "virt-launcher-vm1", secondary("net", "vm1.net")))
	held := allAnnotated(t, ns, 4)
	listed := reserveRecord(t, records, network, 4)
	for _, a := range listed {
		if p, ok := held[a+"/24"]; ok {
			t.Fatalf("the record lists %s, which pod %s holds", a, p)
		}
	}
	stop()

	// A record of a network no NAD serves (deleted while no controller
	// ran) is deleted when the next leader loads the records: the network
	// made again would allocate freely before the keeper rewrote it.
	h := fnv.New64a()
	h.Write([]byte("ghost_net"))
	ghost := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: records, Name: "kvnet-reserve-" + strconv.FormatUint(h.Sum64(), 16),
			Labels: map[string]string{"ipam.kvnet.io/restart-reserve": ""}},
		Data: map[string]string{"network": "ghost_net", "epoch": "0", "addresses": "10.99.0.5"},
	}
	create(t, ghost)

	// The new controller is Ready (runWith waits for it) with its rebuild
	// held: only the reserve can serve.
	hold := make(chan struct{})
	opts.HoldIPAMRebuild = hold
	stop = runWith(t, opts)
	static := listed[3]
	create(t, mkPod(ns, "static", map[string]string{"k8s.v1.cni.cncf.io/networks": fmt.Sprintf(`[{"name":"net","ips":["%s/24"]}]`, static)}))
	mkClaim(t, ns, "vm2.net", network)
	create(t, mkPod(ns, "virt-launcher-vm2", secondary("net", "vm2.net")))
	create(t, mkPod(ns, "new-1", secondary("net", "")))
	got := waitAnnotated(t, ns, "new-1")[ns+"/net"].IPAddresses
	if len(got) != 1 || got[0] != listed[0]+"/24" {
		t.Fatalf("new-1 got %v before the rebuild, want the record's first set %s", got, listed[0])
	}
	reserveRecord(t, records, network, 3)
	if err := c.Get(ctx, client.ObjectKeyFromObject(ghost), &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Errorf("the record of a network no NAD serves: %v, want it deleted", err)
	}
	for _, name := range []string{"static", "virt-launcher-vm2"} {
		var p corev1.Pod
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
			t.Fatal(err)
		}
		if v, ok := p.Annotations[podnetworks.Annotation]; ok {
			t.Fatalf("pod %s served before the rebuild: %s", name, v)
		}
	}

	close(hold)
	ips := allAnnotated(t, ns, 7)
	if p := ips[static+"/24"]; p != "static" {
		t.Errorf("%s held by %q, want pod static (its static request)", static, p)
	}
	if st := claimStatus(t, ns, "vm2.net"); len(st.IPs) != 1 || slices.Contains(listed[:3], strings.TrimSuffix(st.IPs[0], "/24")) {
		t.Errorf("claim vm2.net holds %v; the reserve listed %v", st.IPs, listed)
	}
	// The keeper fills the reserve up again, with free addresses only.
	for _, a := range reserveRecord(t, records, network, 4) {
		if p, ok := ips[a+"/24"]; ok {
			t.Fatalf("the record lists %s, which pod %s holds", a, p)
		}
	}
	stop()

	// A leader without the reserve deletes the records: none is trusted
	// after it.
	opts.RestartReserve, opts.HoldIPAMRebuild = 0, nil
	stop = runWith(t, opts)
	testenv.Eventually(t, 30*time.Second, "records deleted by a leader without the reserve", func() error {
		var list corev1.ConfigMapList
		if err := c.List(ctx, &list, client.InNamespace(records), client.HasLabels{"ipam.kvnet.io/restart-reserve"}); err != nil {
			return err
		}
		if len(list.Items) > 0 {
			return fmt.Errorf("%d left", len(list.Items))
		}
		return nil
	})
	stop()
}

// With leader election, a record is trusted only if every leader since it
// was written kept the reserve: a leader that did not (here an older
// kvnet, simulated by taking the Lease in between) breaks the chain, and
// the next leader serves nothing before its rebuild.
func TestRestartReserveLeaderChain(t *testing.T) {
	ctx := context.Background()
	const ns, records = "reserve-chain", "reserve-chain-records"
	mkNS(t, ns, false)
	mkNS(t, records, false)
	mkUDN(t, ns, "net", udnv1.NetworkRoleSecondary, true, "10.78.0.0/24")
	network := ns + "_net"

	opts := ctl.Options()
	opts.RestartReserve, opts.Namespace = 2, records
	opts.LeaderElection, opts.LeaderElectionNamespace = true, records
	opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod = 4*time.Second, 3*time.Second, 500*time.Millisecond
	stop := runWith(t, opts)
	listed := reserveRecord(t, records, network, 2)
	stop()

	// The next leader continues the chain: it serves from the record.
	hold := make(chan struct{})
	opts.HoldIPAMRebuild = hold
	stop = runLeader(t, opts, records, "1")
	if got := waitAnnotatedWith(t, ns, "new-1"); got != listed[0]+"/24" {
		t.Fatalf("new-1 got %s before the rebuild, want the record's first set %s", got, listed[0])
	}
	close(hold)
	listed = reserveRecord(t, records, network, 2)
	stop()
	epoch := marker(t, records)["to"]

	// Another leader comes and goes without the reserve.
	var l coordinationv1.Lease
	if err := c.Get(ctx, client.ObjectKey{Namespace: records, Name: "kvnet-controller.kvnet.io"}, &l); err != nil {
		t.Fatal(err)
	}
	now := metav1.NewMicroTime(time.Now())
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = ptr.To("an-older-kvnet"), ptr.To(int32(1))
	l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
	l.Spec.LeaseTransitions = ptr.To(*l.Spec.LeaseTransitions + 1)
	if err := c.Update(ctx, &l); err != nil {
		t.Fatal(err)
	}

	hold = make(chan struct{})
	opts.HoldIPAMRebuild = hold
	stop = start(t, opts, env.RunStandby) // not Ready while its rebuild is held
	create(t, mkPod(ns, "new-2", secondary("net", "")))
	var m map[string]string
	testenv.Eventually(t, 60*time.Second, "a new leader marking a new chain", func() error {
		m = marker(t, records)
		if m["to"] == epoch {
			return fmt.Errorf("marker still %v", m)
		}
		return nil
	})
	if m["from"] != m["to"] {
		t.Fatalf("marker %v after a leader without the reserve (previous leader's epoch %s): the chain must start again", m, epoch)
	}
	var p corev1.Pod
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "new-2"}, &p); err != nil {
		t.Fatal(err)
	}
	if v, ok := p.Annotations[podnetworks.Annotation]; ok {
		t.Fatalf("new-2 served before the rebuild with a broken chain: %s", v)
	}
	close(hold)
	got := waitAnnotatedWith(t, ns, "new-2")
	t.Logf("new-2 got %s after the rebuild (the untrusted record listed %v)", got, listed)
	// Rewritten under the new chain.
	testenv.Eventually(t, 30*time.Second, "records rewritten by the new leader", func() error {
		var cm corev1.ConfigMapList
		if err := c.List(ctx, &cm, client.InNamespace(records), client.HasLabels{"ipam.kvnet.io/restart-reserve"}); err != nil {
			return err
		}
		for _, r := range cm.Items {
			if r.Data["network"] == network && r.Data["epoch"] != m["to"] {
				return fmt.Errorf("record of epoch %s", r.Data["epoch"])
			}
		}
		return nil
	})
	stop()
}

// runLeader runs a controller with leader election (its readiness passes
// before it leads) and returns once it leads with epoch and is Ready:
// serving new pods (from the reserve, or after its rebuild).
func runLeader(t *testing.T, opts manager.Options, records, epoch string) (stop func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts.ProbeAddr = l.Addr().String()
	l.Close()
	stop = start(t, opts, env.RunStandby)
	testenv.Eventually(t, 60*time.Second, "leading with epoch "+epoch+" and Ready", func() error {
		var cm corev1.ConfigMap
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: records, Name: "kvnet-restart-reserve"}, &cm); err != nil {
			return err
		}
		if cm.Data["to"] != epoch {
			return fmt.Errorf("marker %v", cm.Data)
		}
		resp, err := http.Get("http://" + opts.ProbeAddr + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	})
	return stop
}

// waitAnnotatedWith creates a pod on ns's network "net" and returns its
// address there once annotated.
func waitAnnotatedWith(t *testing.T, ns, name string) string {
	t.Helper()
	var p corev1.Pod
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
		create(t, mkPod(ns, name, secondary("net", "")))
	}
	got := waitAnnotated(t, ns, name)[ns+"/net"].IPAddresses
	if len(got) != 1 {
		t.Fatalf("%s got %v", name, got)
	}
	return got[0]
}

// marker returns the restart reserve's marker.
func marker(t *testing.T, ns string) map[string]string {
	t.Helper()
	var cm corev1.ConfigMap
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "kvnet-restart-reserve"}, &cm); err != nil {
		t.Fatal(err)
	}
	return cm.Data
}

// The restart reserve never makes a network refuse a pod: when the rest
// of the network is taken, the next allocation gets the reserve back.
func TestRestartReserveGivenBackWhenFull(t *testing.T) {
	ctx := context.Background()
	const ns, records = "reserve-full", "reserve-full-records"
	mkNS(t, ns, false)
	mkNS(t, records, false)
	mkUDN(t, ns, "net", udnv1.NetworkRoleSecondary, false, "10.79.0.0/28") // 14 addresses
	opts := ctl.Options()
	opts.RestartReserve, opts.Namespace = 2, records
	runWith(t, opts)
	create(t, mkPod(ns, "first", secondary("net", "")))
	waitAnnotated(t, ns, "first")
	reserveRecord(t, records, ns+"_net", 2)
	// Created at once: the keeper (once a second) has no time to act.
	for i := range 13 {
		create(t, mkPod(ns, fmt.Sprintf("p-%02d", i), secondary("net", "")))
	}
	allAnnotated(t, ns, 14)
	var evs corev1.EventList
	if err := c.List(ctx, &evs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		if e.Reason == "IPAllocationFailed" {
			t.Errorf("pod %s refused while the reserve held addresses: %s", e.InvolvedObject.Name, e.Message)
		}
	}
	reserveRecord(t, records, ns+"_net", 0)
	// The network is full indeed.
	create(t, mkPod(ns, "one-too-many", secondary("net", "")))
	waitEvent(t, ns, "one-too-many", "IPAllocationFailed", "")
}
