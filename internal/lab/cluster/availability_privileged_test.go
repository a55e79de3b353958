//go:build cluster

package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/audit"
	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/lab/controlplane"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/testenv"
)

// createLog records every create of one kind the loop made.
type createLog struct {
	mu    sync.Mutex
	ok    []time.Time     // when each successful create returned
	took  []time.Duration // how long each create took, failed ones too
	fails []string
}

func (l *createLog) add(start time.Time, err error, what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.took = append(l.took, time.Since(start))
	if err != nil {
		l.fails = append(l.fails, fmt.Sprintf("%s at %s: %v", what, start.Format("15:04:05.000"), err))
		return
	}
	l.ok = append(l.ok, time.Now())
}

func (l *createLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ok)
}

// summary is the creates' count, failures, latency p50/p99/max and the
// longest time between two successful creates (the admission gap as a
// user of the loop saw it).
func (l *createLog) summary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	took := slices.Clone(l.took)
	slices.Sort(took)
	pct := func(p float64) time.Duration {
		if len(took) == 0 {
			return 0
		}
		return took[min(len(took)-1, int(p*float64(len(took))))]
	}
	var gap time.Duration
	for i := 1; i < len(l.ok); i++ {
		gap = max(gap, l.ok[i].Sub(l.ok[i-1]))
	}
	return fmt.Sprintf("%d created, %d failed; create latency p50 %s p99 %s max %s; longest gap between creates %s",
		len(l.ok), len(l.fails), pct(0.5).Round(time.Millisecond), pct(0.99).Round(time.Millisecond),
		pct(1).Round(time.Millisecond), gap.Round(time.Millisecond))
}

// testControllerAvailability: while a loop creates a pod on a primary UDN
// and a VM every 200 ms, kvnet-controller is rolled to a new image and
// then its leader is force-deleted. Every create must succeed (its
// webhooks fail closed, so a moment without a replica would fail them),
// and no IP or MAC may be given twice.
//
// There is no KubeVirt on this cluster: the VMs are API objects of the
// lab's copy of KubeVirt's CRDs with runStrategy Halted, which is all
// the MAC webhook sees. The pods never schedule (a node selector nothing
// matches): their admission and IP allocation are what is measured, not
// their sandboxes.
func testControllerAvailability(ctx context.Context, t *testing.T, c *Cluster) {
	dyn, err := dynamic.NewForConfig(c.CP.Config)
	if err != nil {
		t.Fatal(err)
	}
	scheme, err := manager.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(c.CP.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	crds := installKubeVirtCRDs(ctx, t, cl)
	// Deferred in this order, they run the other way round: the
	// namespace first, while kvnet-controller releases its claims; then
	// the CRDs (uninstall does not know them).
	defer func() {
		for _, crd := range crds {
			if err := cl.Delete(ctx, crd); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete CRD %s: %v", crd.Name, err)
			}
		}
	}()
	const ns = "ctl-ha"
	defer primaryUDNNamespace(ctx, t, c, dyn, ns, netip.MustParsePrefix("10.150.0.0/16"))()
	// Every kvnet-controller replica restarts once KubeVirt's CRDs
	// appear, to serve VMs (each on its own poll: a known gap, see
	// docs/install.md): wait until each has restarted and is Ready
	// again, and a VM gets its MAC from the pool. What this test
	// measures is rolls and kills, from then on.
	testenv.Eventually(t, 3*time.Minute, "kvnet-controller serves the VM webhook", func() error {
		v, err := dyn.Resource(vmGVR).Namespace(ns).Create(ctx, haVM(ns, "probe"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return err
		}
		if vmMAC(v) == "" {
			return fmt.Errorf("VM admitted without a MAC: the VM webhook is not served yet")
		}
		pl, err := c.Client.CoreV1().Pods(KvnetNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=kvnet-controller"})
		if err != nil {
			return err
		}
		for _, p := range pl.Items {
			if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].RestartCount < 1 || !p.Status.ContainerStatuses[0].Ready {
				return fmt.Errorf("pod %s has not restarted for KubeVirt and come back Ready yet", p.Name)
			}
		}
		return waitDeployment(ctx, c)
	})

	var pods, vms createLog
	loopCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	loop := func(kind string, create func(ctx context.Context, name string) error) {
		wg.Go(func() {
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-loopCtx.Done():
					return
				case <-tick.C:
				}
				name := fmt.Sprintf("%s-%04d", kind, i)
				cctx, cancel := context.WithTimeout(ctx, time.Minute)
				start := time.Now()
				err := create(cctx, name)
				cancel()
				if kind == "pod" {
					pods.add(start, err, name)
				} else {
					vms.add(start, err, name)
				}
			}
		})
	}
	loop("pod", func(ctx context.Context, name string) error {
		_, err := c.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{
				NodeSelector: map[string]string{"kvnet.io/availability-test": "no-such-node"},
				Containers:   []corev1.Container{{Name: "c", Image: c.ScenarioTarget().Image}},
			},
		}, metav1.CreateOptions{})
		return err
	})
	loop("vm", func(ctx context.Context, name string) error {
		_, err := dyn.Resource(vmGVR).Namespace(ns).Create(ctx, haVM(ns, name), metav1.CreateOptions{})
		return err
	})
	stopped := false
	stopLoops := func() {
		if !stopped {
			stopped = true
			stop()
			wg.Wait()
		}
	}
	defer stopLoops()
	more := func(what string) {
		t.Helper()
		p0, v0 := pods.count(), vms.count()
		testenv.Eventually(t, 2*time.Minute, "10 more pods and VMs created "+what, func() error {
			if p, v := pods.count()-p0, vms.count()-v0; p < 10 || v < 10 {
				return fmt.Errorf("%d pods and %d VMs so far", p, v)
			}
			return nil
		})
	}
	more("before the roll")

	// A rolling update to a new image (a new tag and digest).
	d, err := c.Client.AppsV1().Deployments(KvnetNamespace).Get(ctx, "kvnet-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	from := d.Spec.Template.Spec.Containers[0].Image
	to, err := rollTarget(from)
	if err != nil {
		t.Fatal(err)
	}
	digest, err := pushRolled(ctx, from, to)
	if err != nil {
		t.Fatal(err)
	}
	rollStart := time.Now()
	patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":%q,"image":%q}]}}}}`, d.Spec.Template.Spec.Containers[0].Name, to)
	if _, err := c.Client.AppsV1().Deployments(KvnetNamespace).Patch(ctx, "kvnet-controller", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Minute, "kvnet-controller rolled to "+to, func() error {
		return rolledTo(ctx, c, to)
	})
	t.Logf("kvnet-controller rolled from %s to %s (%s) in %s", from, to, digest, time.Since(rollStart).Round(time.Second))
	more("after the roll")

	// The leader, force-deleted: gone from the API at once, its
	// process killed without a grace period.
	// Right after a roll the lease may be free for a moment (the old
	// leader released it on stopping; a replica takes it within its
	// retry period): wait for a holder.
	var leader string
	testenv.Eventually(t, time.Minute, "a leader holds the lease after the roll", func() error {
		if leader = leaderPod(ctx, t, c); leader == "" {
			return errors.New("lease released, not yet taken")
		}
		return nil
	})
	killStart := time.Now()
	if err := c.Client.CoreV1().Pods(KvnetNamespace).Delete(ctx, leader, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 3*time.Minute, "a new leader and two replicas again", func() error {
		switch l := leaderPod(ctx, t, c); l {
		case leader:
			return fmt.Errorf("lease still held by %s", leader)
		case "":
			return errors.New("lease released, not yet taken")
		}
		return waitDeployment(ctx, c)
	})
	t.Logf("leader %s force-deleted; a new leader and two available replicas after %s", leader, time.Since(killStart).Round(time.Second))
	more("after the leader's loss")
	stopLoops()

	t.Logf("pods: %s", pods.summary())
	t.Logf("VMs: %s", vms.summary())
	for _, f := range append(pods.fails, vms.fails...) {
		t.Errorf("failed create: %s", f)
	}

	// No MAC twice among the VMs; every pod allocated, no IP twice.
	list, err := dyn.Resource(vmGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for i := range list.Items {
		mac := vmMAC(&list.Items[i])
		if mac == "" {
			t.Errorf("VM %s has no MAC", list.Items[i].GetName())
			continue
		}
		if other, dup := seen[mac]; dup {
			t.Errorf("MAC %s on VMs %s and %s", mac, other, list.Items[i].GetName())
		}
		seen[mac] = list.Items[i].GetName()
	}
	testenv.Eventually(t, 2*time.Minute, "every pod allocated", func() error {
		pl, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, p := range pl.Items {
			if p.Annotations[podnetworks.Annotation] == "" {
				return fmt.Errorf("pod %s has no %s yet", p.Name, podnetworks.Annotation)
			}
		}
		return nil
	})
	rep, err := audit.Run(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Findings {
		if strings.HasPrefix(f.Kind, "Duplicate") {
			t.Errorf("audit: %s %s: %s", f.Kind, f.Object, f.Detail)
		}
	}
	t.Logf("audit: %s; %d VMs with %d distinct MACs", rep.Summary(), len(list.Items), len(seen))
}

// installKubeVirtCRDs creates the lab's copies of KubeVirt's CRDs and
// waits until they are established; it returns them.
func installKubeVirtCRDs(ctx context.Context, t *testing.T, cl client.Client) []*apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	all, err := controlplane.KvnetCRDs()
	if err != nil {
		t.Fatal(err)
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, crd := range all {
		if crd.Spec.Group != "kubevirt.io" {
			continue
		}
		if err := cl.Create(ctx, crd.DeepCopy()); err != nil {
			t.Fatalf("create CRD %s: %v", crd.Name, err)
		}
		out = append(out, crd)
	}
	testenv.Eventually(t, time.Minute, "KubeVirt's CRDs established", func() error {
		for _, crd := range out {
			var got apiextensionsv1.CustomResourceDefinition
			if err := cl.Get(ctx, client.ObjectKeyFromObject(crd), &got); err != nil {
				return err
			}
			established := slices.ContainsFunc(got.Status.Conditions, func(c apiextensionsv1.CustomResourceDefinitionCondition) bool {
				return c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue
			})
			if !established {
				return fmt.Errorf("CRD %s not established", crd.Name)
			}
		}
		return nil
	})
	return out
}

// haVM is a halted VM with one masquerade interface on the pod network,
// whose MAC the pool assigns.
func haVM(ns, name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"runStrategy": "Halted",
			"template": map[string]any{"spec": map[string]any{
				"domain": map[string]any{"devices": map[string]any{"interfaces": []any{
					map[string]any{"name": "default", "masquerade": map[string]any{}},
				}}},
				"networks": []any{map[string]any{"name": "default", "pod": map[string]any{}}},
			}},
		},
	}}
}

// vmMAC is the MAC of a haVM's interface.
func vmMAC(v *unstructured.Unstructured) string {
	ifaces, _, _ := unstructured.NestedSlice(v.Object, "spec", "template", "spec", "domain", "devices", "interfaces")
	if len(ifaces) == 0 {
		return ""
	}
	m, _ := ifaces[0].(map[string]any)
	mac, _ := m["macAddress"].(string)
	return mac
}

// waitDeployment fails until kvnet-controller's Deployment is available
// with every replica.
func waitDeployment(ctx context.Context, c *Cluster) error {
	d, err := c.Client.AppsV1().Deployments(KvnetNamespace).Get(ctx, "kvnet-controller", metav1.GetOptions{})
	if err != nil {
		return err
	}
	if !deploymentAvailable(d) || d.Status.Replicas != ptr.Deref(d.Spec.Replicas, 1) {
		return fmt.Errorf("kvnet-controller: %d replicas, %d updated, %d available", d.Status.Replicas, d.Status.UpdatedReplicas, d.Status.AvailableReplicas)
	}
	return nil
}

// rolledTo fails until every kvnet-controller pod runs image and the
// rollout is complete.
func rolledTo(ctx context.Context, c *Cluster, image string) error {
	if err := waitDeployment(ctx, c); err != nil {
		return err
	}
	pl, err := c.Client.CoreV1().Pods(KvnetNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=kvnet-controller"})
	if err != nil {
		return err
	}
	for _, p := range pl.Items {
		if p.Spec.Containers[0].Image != image {
			return fmt.Errorf("pod %s still runs %s", p.Name, p.Spec.Containers[0].Image)
		}
	}
	return nil
}

// leaderPod is the pod holding kvnet-controller's leader lease (its
// identity is the pod's hostname, then "_" and a UUID).
func leaderPod(ctx context.Context, t *testing.T, c *Cluster) string {
	t.Helper()
	l, err := c.Client.CoordinationV1().Leases(KvnetNamespace).Get(ctx, "kvnet-controller.kvnet.io", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("leader lease: %v", err)
	}
	id := ptr.Deref(l.Spec.HolderIdentity, "")
	pod, _, _ := strings.Cut(id, "_")
	return pod
}
