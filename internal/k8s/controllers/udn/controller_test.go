package udn_test

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/physnet"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/golden"
	"kvnet.io/kvnet/internal/udn"
)

var (
	env *testenv.Env
	c   client.Client
	ctl *testenv.Controller
)

// timeout bounds every wait for the system to converge.
const timeout = 30 * time.Second

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(testenv.Main(m, testenv.Options{}, func(e *testenv.Env) (manager.Options, error) {
		c = e.Client
		return manager.Options{}, nil
	}, &env, &ctl))
}

func mkNS(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
}

var primaryLabel = map[string]string{udn.PrimaryNamespaceLabel: ""}

func l2UDN(ns, name string, role udnv1.NetworkRole, subnets ...udnv1.CIDR) *udnv1.UserDefinedNetwork {
	return &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: udnv1.UserDefinedNetworkSpec{
			Topology: udnv1.NetworkTopologyLayer2,
			Layer2:   &udnv1.Layer2Config{Role: role, Subnets: subnets},
		},
	}
}

func create(t *testing.T, o client.Object) {
	t.Helper()
	testenv.Create(t, c, o)
}

func getNAD(ns, name string) (*nadv1.NetworkAttachmentDefinition, error) {
	var nad nadv1.NetworkAttachmentDefinition
	err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &nad)
	return &nad, err
}

func waitNAD(t *testing.T, ns, name string) *nadv1.NetworkAttachmentDefinition {
	t.Helper()
	var nad *nadv1.NetworkAttachmentDefinition
	testenv.Eventually(t, timeout, "NAD "+ns+"/"+name, func() (err error) {
		nad, err = getNAD(ns, name)
		return err
	})
	return nad
}

func waitNADGone(t *testing.T, ns, name string) {
	t.Helper()
	testenv.Eventually(t, timeout, "NAD "+ns+"/"+name+" gone", func() error {
		if _, err := getNAD(ns, name); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (err=%v)", err)
		}
		return nil
	})
}

// waitCondition waits for obj's NetworkCreated condition to have status,
// reason and a message containing msg, and returns the condition.
func waitCondition(t *testing.T, obj client.Object, status metav1.ConditionStatus, reason, msg string) metav1.Condition {
	t.Helper()
	return waitConditionMatching(t, obj, status, reason, msg, strings.Contains)
}

// waitExactCondition is waitCondition for a message equal to msg.
func waitExactCondition(t *testing.T, obj client.Object, status metav1.ConditionStatus, reason, msg string) metav1.Condition {
	t.Helper()
	return waitConditionMatching(t, obj, status, reason, msg, func(got, want string) bool { return got == want })
}

func waitConditionMatching(t *testing.T, obj client.Object, status metav1.ConditionStatus, reason, msg string, match func(got, want string) bool) metav1.Condition {
	t.Helper()
	var got metav1.Condition
	testenv.Eventually(t, timeout, fmt.Sprintf("condition of %s", obj.GetName()), func() error {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		var conds []metav1.Condition
		switch o := obj.(type) {
		case *udnv1.UserDefinedNetwork:
			conds = o.Status.Conditions
		case *udnv1.ClusterUserDefinedNetwork:
			conds = o.Status.Conditions
		}
		cond := meta.FindStatusCondition(conds, "NetworkCreated")
		if cond == nil {
			return fmt.Errorf("no NetworkCreated condition")
		}
		got = *cond
		if cond.Status != status || cond.Reason != reason || !match(cond.Message, msg) {
			return fmt.Errorf("condition is %s/%s %q, want %s/%s %q", cond.Status, cond.Reason, cond.Message, status, reason, msg)
		}
		return nil
	})
	return got
}

// nadView is what golden files record of a NAD; the network ID varies with
// test order and is checked by TestNetworkIDs instead.
type nadView struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Finalizers  []string          `json:"finalizers,omitempty"`
	Owner       string            `json:"owner"`
	Config      map[string]any    `json:"config"`
}

func checkGolden(t *testing.T, nad *nadv1.NetworkAttachmentDefinition, file string) {
	t.Helper()
	v := nadView{Name: nad.Name, Namespace: nad.Namespace, Labels: nad.Labels, Annotations: map[string]string{}, Finalizers: nad.Finalizers}
	for k, val := range nad.Annotations {
		if k == udn.NetworkIDAnnotation {
			val = "<id>"
		}
		v.Annotations[k] = val
	}
	if ref := metav1.GetControllerOf(nad); ref != nil {
		v.Owner = ref.Kind + "/" + ref.Name
		if ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
			t.Errorf("owner reference without blockOwnerDeletion")
		}
	}
	if err := json.Unmarshal([]byte(nad.Spec.Config), &v.Config); err != nil {
		t.Fatalf("NAD config is not JSON: %v", err)
	}
	got, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, file, got)
}

func TestRenderedNADs(t *testing.T) {
	mkNS(t, "golden-primary", primaryLabel)
	mkNS(t, "golden-primary-l3", primaryLabel) // one primary network per namespace
	mkNS(t, "golden-secondary", map[string]string{"golden": "yes"})

	docs := l2UDN("golden-primary", "primary-udn", udnv1.NetworkRolePrimary, "10.100.0.0/16")
	docs.Labels = map[string]string{"app": "vms"}
	docs.Annotations = map[string]string{"note": "copied", "k8s.ovn.org/internal": "not copied"}
	docs.Spec.Layer2.IPAM = &udnv1.IPAMConfig{Lifecycle: udnv1.IPAMLifecyclePersistent}
	create(t, docs)

	sec := l2UDN("golden-secondary", "secondary-l2", udnv1.NetworkRoleSecondary, "192.168.10.0/24", "fd10::/64")
	sec.Spec.Layer2.MTU = 1400
	create(t, sec)

	l3 := &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: "golden-secondary", Name: "secondary-l3"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer3, Layer3: &udnv1.Layer3Config{
			Role: udnv1.NetworkRoleSecondary, Subnets: []udnv1.Layer3Subnet{{CIDR: "10.200.0.0/16", HostSubnet: 24}},
		}},
	}
	create(t, l3)

	// No joinSubnets: the default is rendered.
	primaryL3 := &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: "golden-primary-l3", Name: "primary-l3"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer3, Layer3: &udnv1.Layer3Config{
			Role: udnv1.NetworkRolePrimary, Subnets: []udnv1.Layer3Subnet{{CIDR: "10.150.0.0/16", HostSubnet: 24}},
		}},
	}
	create(t, primaryL3)

	localnet := &udnv1.ClusterUserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Name: "golden-localnet"},
		Spec: udnv1.ClusterUserDefinedNetworkSpec{
			NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"golden": "yes"}},
			Network: udnv1.NetworkSpec{Topology: udnv1.NetworkTopologyLocalnet, Localnet: &udnv1.LocalnetConfig{
				Role: udnv1.NetworkRoleSecondary, PhysicalNetworkName: "physnet", Subnets: udnv1.DualStackCIDRs{"192.168.100.0/24"},
				ExcludeSubnets: []udnv1.CIDR{"192.168.100.1/32"}, IPAM: &udnv1.IPAMConfig{Lifecycle: udnv1.IPAMLifecyclePersistent},
				VLAN: &udnv1.VLANConfig{Mode: udnv1.VLANModeAccess, Access: &udnv1.AccessVLANConfig{ID: 100}},
			}},
		},
	}
	create(t, localnet)

	checkGolden(t, waitNAD(t, "golden-primary", "primary-udn"), "primary-l2-persistent.yaml")
	checkGolden(t, waitNAD(t, "golden-secondary", "secondary-l2"), "secondary-l2-dualstack.yaml")
	checkGolden(t, waitNAD(t, "golden-secondary", "secondary-l3"), "secondary-l3.yaml")
	checkGolden(t, waitNAD(t, "golden-primary-l3", "primary-l3"), "primary-l3.yaml")
	checkGolden(t, waitNAD(t, "golden-secondary", "golden-localnet"), "cudn-localnet.yaml")

	waitCondition(t, docs, metav1.ConditionTrue, "NetworkAttachmentDefinitionCreated", "NetworkAttachmentDefinition has been created")
	// A localnet network no node maps to a bridge does not read as created
	// (TestLocalnetCondition); a Layer3 one does.
	waitExactCondition(t, localnet, metav1.ConditionFalse, "NoBridgeMapping",
		"NetworkAttachmentDefinition has been created in following namespaces: [golden-secondary], "+
			"but no node maps physical network \"physnet\" to a bridge: annotate the nodes on that network with kvnet.io/bridge-mappings=physnet:<bridge>")
	waitExactCondition(t, l3, metav1.ConditionTrue, "NetworkAttachmentDefinitionCreated", "NetworkAttachmentDefinition has been created")
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(docs), docs); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(docs.Finalizers, udn.Finalizer) {
		t.Errorf("UDN finalizers %v, want %s", docs.Finalizers, udn.Finalizer)
	}
}

func TestPrimaryNeedsNamespaceLabel(t *testing.T) {
	mkNS(t, "unlabelled", nil)
	u := l2UDN("unlabelled", "primary", udnv1.NetworkRolePrimary, "10.0.0.0/24")
	create(t, u)
	waitExactCondition(t, u, metav1.ConditionFalse, "SyncError", invalidPrimaryMessage("unlabelled"))
	if _, err := getNAD("unlabelled", "primary"); !apierrors.IsNotFound(err) {
		t.Fatalf("NAD rendered for a primary network in an unlabelled namespace (err=%v)", err)
	}
	// A secondary network needs no label.
	s := l2UDN("unlabelled", "secondary", udnv1.NetworkRoleSecondary, "10.0.0.0/24")
	create(t, s)
	waitNAD(t, "unlabelled", "secondary")
}

// invalidPrimaryMessage is OVN-Kubernetes' error for a primary network
// selecting a namespace without the primary network label.
func invalidPrimaryMessage(namespace string) string {
	return fmt.Sprintf(`invalid primary network state for namespace %q: a valid primary user defined network or network attachment definition custom resource, and required namespace label "k8s.ovn.org/primary-user-defined-network" must both be present`, namespace)
}

func TestNamespaceLabelImmutable(t *testing.T) {
	const msg = "The 'k8s.ovn.org/primary-user-defined-network' label cannot be added/removed after the namespace was created"
	ctx := context.Background()
	mkNS(t, "label-add", nil)
	mkNS(t, "label-remove", primaryLabel)

	var ns corev1.Namespace
	if err := c.Get(ctx, client.ObjectKey{Name: "label-add"}, &ns); err != nil {
		t.Fatal(err)
	}
	ns.Labels = map[string]string{udn.PrimaryNamespaceLabel: ""}
	if err := c.Update(ctx, &ns); err == nil || !strings.Contains(err.Error(), msg) {
		t.Fatalf("adding the label: err = %v, want %q", err, msg)
	}
	if err := c.Get(ctx, client.ObjectKey{Name: "label-remove"}, &ns); err != nil {
		t.Fatal(err)
	}
	delete(ns.Labels, udn.PrimaryNamespaceLabel)
	if err := c.Update(ctx, &ns); err == nil || !strings.Contains(err.Error(), msg) {
		t.Fatalf("removing the label: err = %v, want %q", err, msg)
	}
	// Other labels stay editable.
	if err := c.Get(ctx, client.ObjectKey{Name: "label-remove"}, &ns); err != nil {
		t.Fatal(err)
	}
	ns.Labels["team"] = "blue"
	if err := c.Update(ctx, &ns); err != nil {
		t.Fatalf("editing another label: %v", err)
	}
}

func TestSecondPrimaryRefused(t *testing.T) {
	mkNS(t, "two-primaries", primaryLabel)
	first := l2UDN("two-primaries", "first", udnv1.NetworkRolePrimary, "10.0.0.0/24")
	create(t, first)
	waitNAD(t, "two-primaries", "first")

	second := l2UDN("two-primaries", "second", udnv1.NetworkRolePrimary, "10.1.0.0/24")
	create(t, second)
	waitCondition(t, second, metav1.ConditionFalse, "SyncError", `primary network already exist in namespace "two-primaries": "first"`)
	if _, err := getNAD("two-primaries", "second"); !apierrors.IsNotFound(err) {
		t.Fatalf("second primary NAD exists (err=%v)", err)
	}

	cudn := &udnv1.ClusterUserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Name: "third-primary"},
		Spec: udnv1.ClusterUserDefinedNetworkSpec{
			NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "two-primaries"}},
			Network:           udnv1.NetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{"10.2.0.0/24"}}},
		},
	}
	create(t, cudn)
	waitCondition(t, cudn, metav1.ConditionFalse, "NetworkAttachmentDefinitionSyncError", `primary network already exist in namespace "two-primaries": "first"`)

	// Once the first goes, the second takes the namespace.
	if err := c.Delete(context.Background(), cudn); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	waitNADGone(t, "two-primaries", "first")
	waitNAD(t, "two-primaries", "second")
	waitCondition(t, second, metav1.ConditionTrue, "NetworkAttachmentDefinitionCreated", "NetworkAttachmentDefinition has been created")
}

func pod(ns, name string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
}

func TestDeletionBlockedWhileInUse(t *testing.T) {
	ctx := context.Background()
	mkNS(t, "in-use", primaryLabel)
	sec := l2UDN("in-use", "blue", udnv1.NetworkRoleSecondary, "10.9.0.0/24")
	create(t, sec)
	prim := l2UDN("in-use", "main", udnv1.NetworkRolePrimary, "10.8.0.0/24")
	create(t, prim)
	waitNAD(t, "in-use", "blue")
	waitNAD(t, "in-use", "main")

	user := pod("in-use", "vm-launcher", map[string]string{"k8s.v1.cni.cncf.io/networks": `[{"name":"blue","namespace":"in-use"}]`})
	create(t, user)

	if err := c.Delete(ctx, sec); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, prim); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, sec, metav1.ConditionFalse, "SyncError", "network in use by the following pods: [in-use/vm-launcher]")
	// The primary network is used by every pod of its labelled namespace.
	waitCondition(t, prim, metav1.ConditionFalse, "SyncError", "network in use by the following pods: [in-use/vm-launcher]")
	if _, err := getNAD("in-use", "blue"); err != nil {
		t.Fatalf("NAD of a network in use is gone: %v", err)
	}

	if err := c.Delete(ctx, user); err != nil {
		t.Fatal(err)
	}
	waitNADGone(t, "in-use", "blue")
	waitNADGone(t, "in-use", "main")
	testenv.Eventually(t, timeout, "UDNs deleted", func() error {
		var list udnv1.UserDefinedNetworkList
		if err := c.List(ctx, &list, client.InNamespace("in-use")); err != nil {
			return err
		}
		if len(list.Items) > 0 {
			return fmt.Errorf("%d UDNs left", len(list.Items))
		}
		return nil
	})
}

func TestCUDNSelectorChanges(t *testing.T) {
	ctx := context.Background()
	mkNS(t, "sel-a", map[string]string{"sel-team": "x"})
	mkNS(t, "sel-b", nil)
	cudn := &udnv1.ClusterUserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Name: "shared"},
		Spec: udnv1.ClusterUserDefinedNetworkSpec{
			NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"sel-team": "x"}},
			Network:           udnv1.NetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{Role: udnv1.NetworkRoleSecondary, Subnets: udnv1.DualStackCIDRs{"10.50.0.0/24"}}},
		},
	}
	create(t, cudn)
	nadA := waitNAD(t, "sel-a", "shared")
	waitCondition(t, cudn, metav1.ConditionTrue, "NetworkAttachmentDefinitionCreated", "in following namespaces: [sel-a]")
	if _, err := getNAD("sel-b", "shared"); !apierrors.IsNotFound(err) {
		t.Fatalf("NAD in unselected namespace (err=%v)", err)
	}

	setLabels := func(name string, labels map[string]string) {
		t.Helper()
		var ns corev1.Namespace
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &ns); err != nil {
			t.Fatal(err)
		}
		ns.Labels = labels
		if err := c.Update(ctx, &ns); err != nil {
			t.Fatal(err)
		}
	}
	setLabels("sel-b", map[string]string{"sel-team": "x"})
	nadB := waitNAD(t, "sel-b", "shared")
	waitCondition(t, cudn, metav1.ConditionTrue, "NetworkAttachmentDefinitionCreated", "in following namespaces: [sel-a, sel-b]")
	if udn.NetworkIDOf(nadA) == 0 || udn.NetworkIDOf(nadA) != udn.NetworkIDOf(nadB) {
		t.Errorf("NADs of one CUDN have network IDs %d and %d, want one non-zero ID", udn.NetworkIDOf(nadA), udn.NetworkIDOf(nadB))
	}

	// A pod in sel-a using the network keeps its NAD when sel-a is unselected.
	create(t, pod("sel-a", "user", map[string]string{"k8s.v1.cni.cncf.io/networks": "shared"}))
	setLabels("sel-a", nil)
	waitCondition(t, cudn, metav1.ConditionFalse, "NetworkAttachmentDefinitionSyncError", "network in use by the following pods: [sel-a/user]")
	if _, err := getNAD("sel-a", "shared"); err != nil {
		t.Fatalf("NAD in use removed: %v", err)
	}
	if err := c.Delete(ctx, pod("sel-a", "user", nil)); err != nil {
		t.Fatal(err)
	}
	waitNADGone(t, "sel-a", "shared")
	waitCondition(t, cudn, metav1.ConditionTrue, "NetworkAttachmentDefinitionCreated", "in following namespaces: [sel-b]")

	// Changing the selector moves the network.
	if err := c.Get(ctx, client.ObjectKeyFromObject(cudn), cudn); err != nil {
		t.Fatal(err)
	}
	cudn.Spec.NamespaceSelector = metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "sel-a"}}
	if err := c.Update(ctx, cudn); err != nil {
		t.Fatal(err)
	}
	waitNAD(t, "sel-a", "shared")
	waitNADGone(t, "sel-b", "shared")
}

func TestNADEditReverted(t *testing.T) {
	ctx := context.Background()
	mkNS(t, "revert", nil)
	u := l2UDN("revert", "net", udnv1.NetworkRoleSecondary, "10.60.0.0/24")
	create(t, u)
	nad := waitNAD(t, "revert", "net")
	want := nad.Spec.Config
	id := udn.NetworkIDOf(nad)

	nad.Spec.Config = `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"hijacked","topology":"layer2"}`
	delete(nad.Labels, udn.NADLabel)
	nad.Annotations[udn.NetworkIDAnnotation] = "4000"
	if err := c.Update(ctx, nad); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, timeout, "NAD reverted", func() error {
		got, err := getNAD("revert", "net")
		if err != nil {
			return err
		}
		if got.Spec.Config != want {
			return fmt.Errorf("config is %s", got.Spec.Config)
		}
		if _, ok := got.Labels[udn.NADLabel]; !ok {
			return fmt.Errorf("label %s not restored", udn.NADLabel)
		}
		if udn.NetworkIDOf(got) != id {
			return fmt.Errorf("network ID %d, want %d", udn.NetworkIDOf(got), id)
		}
		return nil
	})
}

func TestForeignNAD(t *testing.T) {
	mkNS(t, "foreign", nil)
	create(t, &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: "foreign", Name: "taken"},
		Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: `{"cniVersion":"1.0.0","type":"bridge","name":"br"}`},
	})
	u := l2UDN("foreign", "taken", udnv1.NetworkRoleSecondary, "10.70.0.0/24")
	create(t, u)
	waitCondition(t, u, metav1.ConditionFalse, "SyncError", "foreign NetworkAttachmentDefinition with the desired name already exist [foreign/taken]")
	nad, err := getNAD("foreign", "taken")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(nad.Spec.Config, `"bridge"`) {
		t.Fatalf("foreign NAD overwritten: %s", nad.Spec.Config)
	}
}

func TestNetworkIDs(t *testing.T) {
	ctx := context.Background()
	mkNS(t, "ids", nil)
	ids := map[string]int{}
	for _, name := range []string{"n1", "n2", "n3"} {
		create(t, l2UDN("ids", name, udnv1.NetworkRoleSecondary, "10.80.0.0/24"))
	}
	for _, name := range []string{"n1", "n2", "n3"} {
		nad := waitNAD(t, "ids", name)
		ids[name] = udn.NetworkIDOf(nad)
		if ids[name] < 1 || ids[name] > udn.MaxNetworkID {
			t.Fatalf("NAD %s has network ID %q", name, nad.Annotations[udn.NetworkIDAnnotation])
		}
		if nad.Annotations[udn.NetworkNameAnnotation] != "ids_"+name {
			t.Errorf("network name annotation %q", nad.Annotations[udn.NetworkNameAnnotation])
		}
	}
	if ids["n1"] == ids["n2"] || ids["n2"] == ids["n3"] || ids["n1"] == ids["n3"] {
		t.Fatalf("duplicate network IDs: %v", ids)
	}

	ctl.Restart(t)

	create(t, l2UDN("ids", "n4", udnv1.NetworkRoleSecondary, "10.80.0.0/24"))
	n4 := udn.NetworkIDOf(waitNAD(t, "ids", "n4"))
	for name, id := range ids {
		if id == n4 {
			t.Fatalf("after restart, n4 got ID %d already held by %s", n4, name)
		}
	}
	// A repaired NAD keeps its ID after the restart too.
	nad := waitNAD(t, "ids", "n2")
	nad.Spec.Config = "{}"
	if err := c.Update(ctx, nad); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, timeout, "n2 repaired with its ID", func() error {
		got, err := getNAD("ids", "n2")
		if err != nil {
			return err
		}
		if got.Spec.Config == "{}" || udn.NetworkIDOf(got) != ids["n2"] {
			return fmt.Errorf("config %s, id %d (want %d)", got.Spec.Config, udn.NetworkIDOf(got), ids["n2"])
		}
		return nil
	})
	for name := range ids {
		if got := udn.NetworkIDOf(waitNAD(t, "ids", name)); got != ids[name] {
			t.Errorf("after restart %s has ID %d, want %d", name, got, ids[name])
		}
	}
}

func TestNamespaceDeletion(t *testing.T) {
	ctx := context.Background()
	mkNS(t, "doomed", primaryLabel)
	create(t, l2UDN("doomed", "net", udnv1.NetworkRolePrimary, "10.90.0.0/24"))
	waitNAD(t, "doomed", "net")
	if err := c.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "doomed"}}); err != nil {
		t.Fatal(err)
	}
	// kube-controller-manager's namespace controller deletes the UDN; the
	// finalizers are released by kvnet; then the namespace goes.
	testenv.Eventually(t, timeout, "namespace gone", func() error {
		var ns corev1.Namespace
		err := c.Get(ctx, client.ObjectKey{Name: "doomed"}, &ns)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("namespace phase %s (err=%v)", ns.Status.Phase, err)
	})
}

// TestHandwrittenNADs: kvnet-cni NADs written by hand get network IDs (the
// node agents need them), shared by every NAD of one network, distinct
// from other networks', kept across restarts; other plugins' NADs are
// left alone.
func TestHandwrittenNADs(t *testing.T) {
	mkNS(t, "hw-a", nil)
	mkNS(t, "hw-b", nil)
	mkNS(t, "hw-ids", nil)
	create(t, l2UDN("hw-ids", "rendered", udnv1.NetworkRoleSecondary, "10.81.0.0/24"))
	hand := func(ns, name, network string) *nadv1.NetworkAttachmentDefinition {
		nad := &nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		nad.Spec.Config = fmt.Sprintf(`{"cniVersion":"1.1.0","type":"kvnet-cni","name":%q,"netAttachDefName":"%s/%s","topology":"layer2","role":"secondary","subnets":"10.82.0.0/24"}`, network, ns, name)
		create(t, nad)
		return nad
	}
	hand("hw-a", "shared", "tenant-shared")
	hand("hw-b", "shared", "tenant-shared")
	hand("hw-a", "other", "tenant-other")
	bridge := &nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: "hw-a", Name: "br"}}
	bridge.Spec.Config = `{"cniVersion":"1.0.0","type":"bridge","name":"br"}`
	create(t, bridge)

	idOf := func(ns, name string) int {
		t.Helper()
		var id int
		testenv.Eventually(t, timeout, "network ID of "+ns+"/"+name, func() error {
			nad, err := getNAD(ns, name)
			if err != nil {
				return err
			}
			if id = udn.NetworkIDOf(nad); id == 0 {
				return fmt.Errorf("annotations %v", nad.Annotations)
			}
			return nil
		})
		return id
	}
	shared, sharedB, other := idOf("hw-a", "shared"), idOf("hw-b", "shared"), idOf("hw-a", "other")
	rendered := udn.NetworkIDOf(waitNAD(t, "hw-ids", "rendered"))
	if shared != sharedB {
		t.Errorf("one network, two IDs: %d and %d", shared, sharedB)
	}
	if shared == other || shared == rendered || other == rendered {
		t.Errorf("IDs collide: shared %d, other %d, rendered %d", shared, other, rendered)
	}
	if got, _ := getNAD("hw-a", "br"); got.Annotations[udn.NetworkIDAnnotation] != "" {
		t.Errorf("bridge NAD got a network ID: %v", got.Annotations)
	}

	ctl.Restart(t)
	create(t, l2UDN("hw-ids", "after", udnv1.NetworkRoleSecondary, "10.83.0.0/24"))
	if after := udn.NetworkIDOf(waitNAD(t, "hw-ids", "after")); after == shared || after == other {
		t.Errorf("after restart a UDN got ID %d of a hand-written network", after)
	}
	if idOf("hw-b", "shared") != shared || idOf("hw-a", "other") != other {
		t.Error("hand-written network IDs changed across the restart")
	}
}

// l2CUDN returns a Layer2 CUDN selecting namespaces by name.
func l2CUDN(name string, role udnv1.NetworkRole, namespaces []string, subnets ...udnv1.CIDR) *udnv1.ClusterUserDefinedNetwork {
	return &udnv1.ClusterUserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: udnv1.ClusterUserDefinedNetworkSpec{
			NamespaceSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpIn, Values: namespaces,
			}}},
			Network: udnv1.NetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{Role: role, Subnets: subnets}},
		},
	}
}

func del(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := c.Delete(context.Background(), o); err != nil {
			t.Fatalf("delete %T %s: %v", o, o.GetName(), err)
		}
	}
}

// waitGone waits until each object is gone from the API (finalizers done).
func waitGone(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		testenv.Eventually(t, timeout, o.GetName()+" gone", func() error {
			err := c.Get(context.Background(), client.ObjectKeyFromObject(o), o.DeepCopyObject().(client.Object))
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("still there (err=%v)", err)
		})
	}
}

// TestDeletedNADHeldByPods: a user deletes the NAD of a network a pod
// uses. Our finalizer holds it while the pod lives, and the network reports
// it as being deleted (OVN-Kubernetes' reason and message, not a sync
// error). Once the pod goes, the NAD goes, and the controller creates it
// again with the same network ID.
func TestDeletedNADHeldByPods(t *testing.T) {
	const ns = "nad-deleted"
	mkNS(t, ns, nil)
	for _, tc := range []struct {
		network           client.Object
		deleting, created string // NetworkCreated messages
	}{
		{l2UDN(ns, "udn", udnv1.NetworkRoleSecondary, "10.91.0.0/24"),
			"NetworkAttachmentDefinition is being deleted",
			"NetworkAttachmentDefinition has been created"},
		{l2CUDN("nad-deleted-cudn", udnv1.NetworkRoleSecondary, []string{ns}, "10.92.0.0/24"),
			"NetworkAttachmentDefinition are being deleted: [nad-deleted/nad-deleted-cudn]",
			"NetworkAttachmentDefinition has been created in following namespaces: [nad-deleted]"},
	} {
		name := tc.network.GetName()
		t.Run(name, func(t *testing.T) {
			user := pod(ns, "user-of-"+name, map[string]string{"k8s.v1.cni.cncf.io/networks": name})
			create(t, user)
			create(t, tc.network)
			old := waitNAD(t, ns, name)
			waitExactCondition(t, tc.network, metav1.ConditionTrue, "NetworkAttachmentDefinitionCreated", tc.created)

			del(t, old)
			waitExactCondition(t, tc.network, metav1.ConditionFalse, "NetworkAttachmentDefinitionDeleted", tc.deleting)
			waitEvent(t, tc.network, corev1.EventTypeWarning, "NetworkAttachmentDefinitionDeleted")
			if held, err := getNAD(ns, name); err != nil || held.DeletionTimestamp == nil {
				t.Fatalf("NAD in use not held terminating: err=%v", err)
			}

			del(t, user)
			testenv.Eventually(t, timeout, "NAD recreated", func() error {
				nad, err := getNAD(ns, name)
				if err != nil {
					return err
				}
				if nad.UID == old.UID {
					return fmt.Errorf("still the deleted NAD")
				}
				if got, want := udn.NetworkIDOf(nad), udn.NetworkIDOf(old); got != want {
					t.Fatalf("recreated NAD has network ID %d, want %d", got, want)
				}
				return nil
			})
			waitExactCondition(t, tc.network, metav1.ConditionTrue, "NetworkAttachmentDefinitionCreated", tc.created)
		})
	}
}

// networkIDsInUse returns the network IDs on NADs in the API.
func networkIDsInUse(t *testing.T) map[int]bool {
	t.Helper()
	var list nadv1.NetworkAttachmentDefinitionList
	if err := c.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	ids := map[int]bool{}
	for i := range list.Items {
		ids[udn.NetworkIDOf(&list.Items[i])] = true
	}
	return ids
}

// lowestFreeID returns the lowest network ID on no NAD.
func lowestFreeID(t *testing.T) int {
	t.Helper()
	inUse := networkIDsInUse(t)
	for id := 1; id <= udn.MaxNetworkID; id++ {
		if !inUse[id] {
			return id
		}
	}
	t.Fatal("no free network ID")
	return 0
}

// createNetwork creates a network whose NAD is namespace/name, and returns
// its network ID.
func createNetwork(t *testing.T, network client.Object, namespace string) int {
	t.Helper()
	create(t, network)
	return udn.NetworkIDOf(waitNAD(t, namespace, network.GetName()))
}

// TestNetworkIDsFreed: deleting a UDN or a CUDN frees its network ID.
// internal/udn.IDAllocator hands IDs out round robin from a cursor that
// starts at 1: a freed ID is not reused at once (nodes may still be tearing
// its network down), not even by a network of the same name, but a
// restarted controller starts over at 1 and gives the next networks the
// lowest free IDs, the freed ones among them.
func TestNetworkIDsFreed(t *testing.T) {
	const ns = "ids-freed"
	mkNS(t, ns, nil)
	udnA := func() client.Object { return l2UDN(ns, "a", udnv1.NetworkRoleSecondary, "10.84.0.0/24") }
	cudnC := func() client.Object {
		return l2CUDN("ids-freed-c", udnv1.NetworkRoleSecondary, []string{ns}, "10.85.0.0/24")
	}

	ctl.Restart(t)
	lowest := lowestFreeID(t)
	a, cu := udnA(), cudnC()
	ida := createNetwork(t, a, ns)
	idb := createNetwork(t, l2UDN(ns, "b", udnv1.NetworkRoleSecondary, "10.86.0.0/24"), ns)
	idc := createNetwork(t, cu, ns)
	if ida != lowest || idb <= ida || idc <= idb {
		t.Fatalf("after a restart got IDs a=%d b=%d c=%d, want ascending from the lowest free ID %d", ida, idb, idc, lowest)
	}

	del(t, a, cu)
	waitGone(t, a, cu)
	if inUse := networkIDsInUse(t); inUse[ida] || inUse[idc] {
		t.Fatalf("IDs %d and %d of deleted networks still on NADs", ida, idc)
	}
	// Round robin: networks of the same names get new IDs.
	if id := createNetwork(t, udnA(), ns); id == ida || id == idc {
		t.Errorf("UDN a recreated got freed ID %d at once (a had %d, c had %d)", id, ida, idc)
	}
	if id := createNetwork(t, cudnC(), ns); id == ida || id == idc {
		t.Errorf("CUDN recreated got freed ID %d at once (a had %d, c had %d)", id, ida, idc)
	}

	ctl.Restart(t)
	if lowest := lowestFreeID(t); lowest != ida {
		t.Fatalf("lowest free ID is %d, want the freed %d (did another test free one?)", lowest, ida)
	}
	if id := createNetwork(t, l2UDN(ns, "d", udnv1.NetworkRoleSecondary, "10.87.0.0/24"), ns); id != ida {
		t.Errorf("new UDN got ID %d, want the UDN's freed %d", id, ida)
	}
	if id := createNetwork(t, l2CUDN("ids-freed-e", udnv1.NetworkRoleSecondary, []string{ns}, "10.88.0.0/24"), ns); id != idc {
		t.Errorf("new CUDN got ID %d, want the CUDN's freed %d", id, idc)
	}
}

// waitEvent waits for an events.k8s.io/v1 event of eventType and reason
// regarding obj.
func waitEvent(t *testing.T, obj client.Object, eventType, reason string) {
	t.Helper()
	gvk, err := c.GroupVersionKindFor(obj)
	if err != nil {
		t.Fatal(err)
	}
	// Events about cluster-scoped objects go to the default namespace.
	eventNS := cmp.Or(obj.GetNamespace(), metav1.NamespaceDefault)
	testenv.Eventually(t, timeout, fmt.Sprintf("%s event %s on %s %s", eventType, reason, gvk.Kind, obj.GetName()), func() error {
		var list eventsv1.EventList
		if err := c.List(context.Background(), &list, client.InNamespace(eventNS)); err != nil {
			return err
		}
		var seen []string
		for _, ev := range list.Items {
			r := ev.Regarding
			if r.UID != obj.GetUID() {
				continue
			}
			if r.Kind != gvk.Kind || r.Namespace != obj.GetNamespace() || r.Name != obj.GetName() || ev.ReportingController != "kvnet-udn-controller" {
				t.Fatalf("event %s regards %s %s/%s, reported by %q", ev.Name, r.Kind, r.Namespace, r.Name, ev.ReportingController)
			}
			if ev.Type == eventType && ev.Reason == reason {
				return nil
			}
			seen = append(seen, ev.Type+"/"+ev.Reason)
		}
		return fmt.Errorf("not recorded; events on it: %v", seen)
	})
}

// TestEvents: the controllers record events on the UDN or CUDN concerned: a
// change of NetworkCreated (Normal when created, else Warning with the
// condition's reason), and NetworkInUse while a deletion waits for pods.
func TestEvents(t *testing.T) {
	const ns = "events" // unlabelled: primary networks fail here
	mkNS(t, ns, nil)
	ok := l2UDN(ns, "ok", udnv1.NetworkRoleSecondary, "10.93.0.0/24")
	bad := l2UDN(ns, "bad", udnv1.NetworkRolePrimary, "10.94.0.0/24")
	cok := l2CUDN("events-ok", udnv1.NetworkRoleSecondary, []string{ns}, "10.95.0.0/24")
	cbad := l2CUDN("events-bad", udnv1.NetworkRolePrimary, []string{ns}, "10.96.0.0/24")
	user := pod(ns, "user", map[string]string{"k8s.v1.cni.cncf.io/networks": "ok,events-ok"})
	for _, o := range []client.Object{user, ok, bad, cok, cbad} {
		create(t, o)
	}
	waitNAD(t, ns, ok.Name)
	waitNAD(t, ns, cok.Name)
	del(t, ok, cok) // blocked by the pod

	for _, want := range []struct {
		obj               client.Object
		eventType, reason string
	}{
		{ok, corev1.EventTypeNormal, "NetworkAttachmentDefinitionCreated"},
		{ok, corev1.EventTypeWarning, "NetworkInUse"},
		{bad, corev1.EventTypeWarning, "SyncError"},
		{cok, corev1.EventTypeNormal, "NetworkAttachmentDefinitionCreated"},
		{cok, corev1.EventTypeWarning, "NetworkInUse"},
		{cbad, corev1.EventTypeWarning, "NetworkAttachmentDefinitionSyncError"},
	} {
		waitEvent(t, want.obj, want.eventType, want.reason)
	}

	del(t, user, bad, cbad)
	waitGone(t, ok, bad, cok, cbad)
}

// TestCUDNPrimaryNeedsNamespaceLabel: a primary CUDN renders its NAD in the
// selected namespaces that carry the primary network label, and reports
// the others as a sync error.
func TestCUDNPrimaryNeedsNamespaceLabel(t *testing.T) {
	mkNS(t, "cudn-labelled", primaryLabel)
	mkNS(t, "cudn-unlabelled", nil)
	cu := l2CUDN("cudn-primary", udnv1.NetworkRolePrimary, []string{"cudn-labelled", "cudn-unlabelled"}, "10.97.0.0/24")
	create(t, cu)
	waitExactCondition(t, cu, metav1.ConditionFalse, "NetworkAttachmentDefinitionSyncError", invalidPrimaryMessage("cudn-unlabelled"))
	waitNAD(t, "cudn-labelled", cu.Name)
	if _, err := getNAD("cudn-unlabelled", cu.Name); !apierrors.IsNotFound(err) {
		t.Fatalf("NAD rendered for a primary network in an unlabelled namespace (err=%v)", err)
	}
}

// TestForeignOverlayNAD: a hand-written NAD of OVN-Kubernetes' type
// (ovn-k8s-cni-overlay) is never ignored in silence: kvnet marks it with
// kvnet.io/not-served and a warning event naming the one-field change,
// gives it no network ID, and once the type is kvnet-cni drops the mark
// and serves it.
func TestForeignOverlayNAD(t *testing.T) {
	const ns = "ovn-written"
	mkNS(t, ns, nil)
	nad := &nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "l2"}}
	nad.Spec.Config = `{"cniVersion":"0.4.0","type":"ovn-k8s-cni-overlay","name":"ovn-written-l2","netAttachDefName":"ovn-written/l2","topology":"layer2","subnets":"10.97.0.0/24"}`
	create(t, nad)
	testenv.Eventually(t, timeout, "the OVN-Kubernetes NAD is marked not served", func() error {
		got, err := getNAD(ns, "l2")
		if err != nil {
			return err
		}
		msg := got.Annotations[udn.NotServedAnnotation]
		if !strings.Contains(msg, `"type": "ovn-k8s-cni-overlay"`) || !strings.Contains(msg, `"type": "kvnet-cni"`) {
			return fmt.Errorf("annotation %s = %q, want it to name both types", udn.NotServedAnnotation, msg)
		}
		return nil
	})
	waitEvent(t, nad, corev1.EventTypeWarning, "NotServed")
	if got, _ := getNAD(ns, "l2"); udn.NetworkIDOf(got) != 0 {
		t.Errorf("a NAD kvnet does not serve got a network ID: %v", got.Annotations)
	}

	// The one-field change: served, the mark gone.
	got, err := getNAD(ns, "l2")
	if err != nil {
		t.Fatal(err)
	}
	got.Spec.Config = strings.Replace(got.Spec.Config, "ovn-k8s-cni-overlay", "kvnet-cni", 1)
	if err := c.Update(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, timeout, "the fixed NAD is served", func() error {
		got, err := getNAD(ns, "l2")
		if err != nil {
			return err
		}
		if _, marked := got.Annotations[udn.NotServedAnnotation]; marked || udn.NetworkIDOf(got) == 0 {
			return fmt.Errorf("annotations %v: want a network ID and no %s", got.Annotations, udn.NotServedAnnotation)
		}
		return nil
	})
}

// TestLocalnetCondition: a localnet CUDN reads as created only once a node
// maps its physical network to a bridge, and not while a node that maps
// it lacks the 802.1Q support its VLAN needs; node annotation changes
// bring the condition along.
func TestLocalnetCondition(t *testing.T) {
	mkNS(t, "localnet-cond", map[string]string{"localnet-cond": "yes"})
	cudn := &udnv1.ClusterUserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Name: "localnet-cond"},
		Spec: udnv1.ClusterUserDefinedNetworkSpec{
			NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"localnet-cond": "yes"}},
			Network: udnv1.NetworkSpec{Topology: udnv1.NetworkTopologyLocalnet, Localnet: &udnv1.LocalnetConfig{
				Role: udnv1.NetworkRoleSecondary, PhysicalNetworkName: "condnet", Subnets: udnv1.DualStackCIDRs{"192.168.77.0/24"},
				VLAN: &udnv1.VLANConfig{Mode: udnv1.VLANModeAccess, Access: &udnv1.AccessVLANConfig{ID: 300}},
			}},
		},
	}
	create(t, cudn)
	const created = "NetworkAttachmentDefinition has been created in following namespaces: [localnet-cond]"
	waitExactCondition(t, cudn, metav1.ConditionFalse, "NoBridgeMapping",
		created+", but no node maps physical network \"condnet\" to a bridge: annotate the nodes on that network with kvnet.io/bridge-mappings=condnet:<bridge>")

	// A node on another physical network changes nothing; one on condnet
	// without 8021q makes the VLAN the problem.
	other := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ln-other", Annotations: map[string]string{physnet.BridgeMappingsAnnotation: "elsewhere:br9"}}}
	create(t, other)
	n1 := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ln-n1", Annotations: map[string]string{
		physnet.BridgeMappingsAnnotation: "physnet:br-phys,condnet:br-cond", physnet.MissingKernelFeaturesAnnotation: "8021q"}}}
	create(t, n1)
	waitExactCondition(t, cudn, metav1.ConditionFalse, "KernelFeatureMissing",
		created+", but vlan.access.id 300 needs 802.1Q VLAN links (the Linux kernel module 8021q), which nodes ln-n1 lack: "+
			"kvnet does not attach the network untagged, so pods and VMs on those nodes fail to start")

	// kvnet-node on a kernel with 8021q clears the annotation.
	patch := client.MergeFrom(n1.DeepCopy())
	delete(n1.Annotations, physnet.MissingKernelFeaturesAnnotation)
	if err := c.Patch(context.Background(), n1, patch); err != nil {
		t.Fatal(err)
	}
	waitExactCondition(t, cudn, metav1.ConditionTrue, "NetworkAttachmentDefinitionCreated", created)
}
