package install_test

import (
	"context"
	"maps"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/install"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/testenv"
)

// TestCheckDefaultNetworkSubnets: kvnet check warns, naming a pod and its
// address, when a default-network pod lies outside the Nodes'
// spec.podCIDRs and kvnet-node's --default-network-cidrs (primary
// networks refuse only those), and is content once the flag (in either
// spelling, or the ConfigMap kvnet-node-config, which the flag overrides)
// covers it; a bad value is named with where it is. Host-network pods do
// not count.
func TestCheckDefaultNetworkSubnets(t *testing.T) {
	ctx := context.Background()
	const what = "default network pod subnets"
	const ns, kvnetNS = "dn-check", "dn-check-kvnet"
	create := creator(t)
	create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kvnetNS}})
	create(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dn-check-node"}, Spec: corev1.NodeSpec{PodCIDR: "10.244.7.0/24", PodCIDRs: []string{"10.244.7.0/24"}}})
	pod := func(name, ip string, hostNetwork bool) {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.PodSpec{HostNetwork: hostNetwork, Containers: []corev1.Container{{Name: "c", Image: testImage}}}}
		create(p)
		p.Status.PodIP, p.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
		if err := c.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	check := func(o install.CheckOptions, status install.Status, detail ...string) {
		t.Helper()
		f := findings(t, o)[what]
		if f.Status != status {
			t.Errorf("%+v: %v, want %s", o, f, status)
		}
		for _, d := range detail {
			if !strings.Contains(f.String(), d) {
				t.Errorf("%+v: %v, want it to say %q", o, f, d)
			}
		}
	}
	prereq := install.CheckOptions{Prerequisites: true}
	pod("inside", "10.244.7.5", false)
	pod("host", "192.0.2.10", true)
	check(prereq, install.OK, "within the Nodes' spec.podCIDRs")
	pod("pool", "192.168.77.5", false)
	check(prereq, install.Warning, "pod dn-check/pool has 192.168.77.5", "set default-network-cidrs: <")

	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: kvnetNS, Name: "kvnet-node"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "n"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "n"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "node", Image: testImage, Args: []string{"--cni-bin-dir=/opt"}}}}}}}
	create(ds)
	installed := install.CheckOptions{Namespace: kvnetNS}
	check(installed, install.Warning, "outside the Nodes' spec.podCIDRs and kvnet-node's --default-network-cidrs", "192.168.77.5")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: kvnetNS, Name: "kvnet-node-config"}, Data: map[string]string{"default-network-cidrs": ""}}
	create(cm)
	for _, tc := range []struct {
		args   []string
		cm     string // the ConfigMap's default-network-cidrs
		status install.Status
		detail string
	}{
		{nil, "", install.Warning, "192.168.77.5"},
		{nil, "192.168.0.0/16", install.OK, "all within"},
		{nil, "10.0.0.0/8,bad", install.Warning, `ConfigMap dn-check-kvnet/kvnet-node-config, key default-network-cidrs: kvnet-node --default-network-cidrs "bad"`},
		{[]string{"--default-network-cidrs=192.168.0.0/16"}, "", install.OK, "all within"},
		{[]string{"-default-network-cidrs", "192.168.0.0/16,fd00:10::/56"}, "", install.OK, "all within"},
		{[]string{"--default-network-cidrs=192.168.0.0/20"}, "192.168.0.0/16", install.Warning, "192.168.77.5"}, // the args win
		{[]string{"--default-network-cidrs=192.168.0.0/16,calico"}, "", install.Warning, `DaemonSet dn-check-kvnet/kvnet-node: kvnet-node --default-network-cidrs "calico"`},
		{[]string{"--default-network-cidrs"}, "", install.Warning, "--default-network-cidrs has no value"},
	} {
		ds.Spec.Template.Spec.Containers[0].Args = append([]string{"--cni-bin-dir=/opt"}, tc.args...)
		if err := c.Update(ctx, ds); err != nil {
			t.Fatal(err)
		}
		cm.Data["default-network-cidrs"] = tc.cm
		if err := c.Update(ctx, cm); err != nil {
			t.Fatal(err)
		}
		check(installed, tc.status, tc.detail)
	}
}

// creator returns a function creating objects in the API server, which
// are deleted when the test ends.
func creator(t *testing.T) func(client.Object) {
	var made []client.Object
	t.Cleanup(func() {
		for _, o := range made {
			_ = c.Delete(context.Background(), o, client.GracePeriodSeconds(0))
		}
	})
	return func(o client.Object) {
		t.Helper()
		testenv.Create(t, c, o)
		made = append(made, o)
	}
}

// TestKubeVirtVersionProblem: the known-bad pair is KubeVirt before
// v1.8.4 on Kubernetes 1.36 or later, however the versions are spelt.
func TestKubeVirtVersionProblem(t *testing.T) {
	for _, tc := range []struct {
		kubevirt, kubernetes string
		bad                  bool
	}{
		{"v1.7.0", "v1.36.3", true},
		{"v1.8.3", "v1.36.0", true},
		{"v1.6.2", "v1.37.2+k3s1", true},
		{"v1.7.0", "v1.36.0-alpha.1", true},
		{"v1.8.4", "v1.36.3", false},
		{"v1.9.0", "v1.36.3", false},
		{"v1.9.0-rc.0", "v1.36.3", false},
		{"v1.7.0", "v1.35.2", false},
		{"v1.8.3", "v1.34.1", false},
		{"", "v1.36.3", false},
		{"v1.7.0", "not a version", false},
	} {
		problem, fix := install.KubeVirtVersionProblem(tc.kubevirt, tc.kubernetes)
		if got := problem != ""; got != tc.bad {
			t.Errorf("KubeVirt %q on Kubernetes %q: problem %q, want bad=%v", tc.kubevirt, tc.kubernetes, problem, tc.bad)
		}
		if tc.bad && (!strings.Contains(problem, "#17858") || !strings.Contains(fix, "v1.8.4")) {
			t.Errorf("KubeVirt %q on Kubernetes %q: %q / %q, want the issue and the fix named", tc.kubevirt, tc.kubernetes, problem, fix)
		}
	}
}

// TestCheckMultusLimits: thick Multus's daemon with upstream's limits
// (CPU 100m, memory 50Mi) gets a warning naming both, with the commands
// that lift them; without a CPU limit and with 200Mi it is ok; thin
// Multus (no multus-daemon) is not judged by its DaemonSet's limits.
func TestCheckMultusLimits(t *testing.T) {
	ctx := context.Background()
	const ns = "multus-limits"
	testenv.Create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	ds := func(command string, limits corev1.ResourceList) *appsv1.DaemonSet {
		labels := map[string]string{"app": "multus"}
		return &appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kube-multus-ds"},
			Spec: appsv1.DaemonSetSpec{
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{
						Name: "kube-multus", Image: testImage, Command: []string{command},
						Resources: corev1.ResourceRequirements{Limits: limits},
					}}},
				},
			},
		}
	}
	for _, tt := range []struct {
		name    string
		command string
		limits  corev1.ResourceList
		status  install.Status
		says    []string
	}{
		{"upstream thick", "/usr/src/multus-cni/bin/multus-daemon",
			corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("50Mi")},
			install.Warning, []string{"CPU is limited to 100m", "memory is limited to 50Mi", `"cpu":null`, "--limits=memory=200Mi", ns + "/kube-multus-ds"}},
		{"thick, lifted", "/usr/src/multus-cni/bin/multus-daemon",
			corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("200Mi")},
			install.OK, []string{"no CPU limit, memory limit 200Mi"}},
		{"thin", "/thin_entrypoint",
			corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("50Mi")},
			install.OK, []string{"thin Multus"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			obj := ds(tt.command, tt.limits)
			testenv.Create(t, c, obj)
			defer func() {
				if err := c.Delete(ctx, obj); err != nil {
					t.Fatal(err)
				}
			}()
			f := findings(t, install.CheckOptions{Prerequisites: true})[install.MultusLimitsCheck]
			if f.Status != tt.status {
				t.Errorf("%v, want %s", f, tt.status)
			}
			for _, s := range tt.says {
				if !strings.Contains(f.String(), s) {
					t.Errorf("%v: want it to say %q", f, s)
				}
			}
		})
	}
}

// TestCheckPodNetworkLabels: kvnet check counts the allocated pods that
// lack their network labels, naming one; that warns only where kvnet-node
// runs --pod-scope=networks (the ConfigMap, or the DaemonSet's args,
// which win), and says how to have them labelled. Once the pod carries
// its labels, all is well.
func TestCheckPodNetworkLabels(t *testing.T) {
	ctx := context.Background()
	const ns, kvnetNS = "pl-check", "pl-check-kvnet"
	create := creator(t)
	create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kvnetNS}})
	nets := podnetworks.Networks{ns + "/udn": {IPAddresses: []string{"10.9.0.5/24"}, MACAddress: "0a:58:0a:09:00:05", Role: podnetworks.RolePrimary, Network: ns + "_udn"}}
	value, err := nets.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	pod := func(name string, labels map[string]string) *corev1.Pod {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, Annotations: map[string]string{podnetworks.Annotation: value}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: testImage}}}}
		create(p)
		return p
	}
	pod("labelled", nets.Labels())
	old := pod("old", map[string]string{"app": "x"})
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: kvnetNS, Name: "kvnet-node"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "n"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "n"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "node", Image: testImage}}}}}}
	create(ds)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: kvnetNS, Name: "kvnet-node-config"}, Data: map[string]string{"pod-scope": ""}}
	create(cm)
	installed := install.CheckOptions{Namespace: kvnetNS}
	check := func(status install.Status, detail ...string) {
		t.Helper()
		f := findings(t, installed)[install.PodNetworkLabelsCheck]
		if f.Status != status {
			t.Errorf("%v, want %s", f, status)
		}
		for _, d := range detail {
			if !strings.Contains(f.String(), d) {
				t.Errorf("%v, want it to say %q", f, d)
			}
		}
	}
	check(install.OK, "1 of ", "pod pl-check/old", "only kvnet-node --pod-scope=networks needs them")
	cm.Data["pod-scope"] = "networks"
	if err := c.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	check(install.Warning, "pod pl-check/old", "ConfigMap pl-check-kvnet/kvnet-node-config, key pod-scope", "rollout restart deployment kvnet-controller")
	ds.Spec.Template.Spec.Containers[0].Args = []string{"--pod-scope=cluster"}
	if err := c.Update(ctx, ds); err != nil {
		t.Fatal(err)
	}
	check(install.OK, "pod pl-check/old") // the args win
	ds.Spec.Template.Spec.Containers[0].Args = []string{"--pod-scope", "networks"}
	if err := c.Update(ctx, ds); err != nil {
		t.Fatal(err)
	}
	check(install.Warning, "DaemonSet pl-check-kvnet/kvnet-node")
	patch := client.MergeFrom(old.DeepCopy())
	maps.Copy(old.Labels, nets.Labels())
	if err := c.Patch(ctx, old, patch); err != nil {
		t.Fatal(err)
	}
	check(install.OK, "carry their network labels")
}
