package simkubelet

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
)

const (
	kvnetPrimary = `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"tenant_net","netAttachDefName":"tenant/net","topology":"layer2","role":"primary","subnets":"10.0.0.0/24"}`
	kvnetSecond  = `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"tenant_blue","netAttachDefName":"tenant/blue","topology":"layer2","role":"secondary","subnets":"10.1.0.0/24"}`
	bridgeList   = `{"cniVersion":"1.0.0","name":"br","plugins":[{"type":"bridge","bridge":"br0"},{"type":"tuning"}]}`
)

func fakeReader(t *testing.T, labelled bool, nads map[string]string) client.Reader {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := nadv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}}
	if labelled {
		ns.Labels = map[string]string{"k8s.ovn.org/primary-user-defined-network": ""}
	}
	objs := []client.Object{ns, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other"}}}
	for key, config := range nads {
		nsName, name, _ := strings.Cut(key, "/")
		objs = append(objs, &nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: nsName, Name: name},
			Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: config}})
	}
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
}

func pod(networks string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "p", UID: "0b3c2a1d-aaaa-bbbb-cccc-123456789abc"}}
	if networks != "" {
		p.Annotations = map[string]string{"k8s.v1.cni.cncf.io/networks": networks}
	}
	return p
}

func TestAttachmentsLikeMultus(t *testing.T) {
	r := fakeReader(t, true, map[string]string{"tenant/net": kvnetPrimary, "tenant/blue": kvnetSecond, "other/br": bridgeList})
	atts, err := attachments(context.Background(), r, pod(`blue, other/br@eth9, blue@third`), nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range atts {
		got = append(got, a.String())
	}
	want := []string{
		"attachment ovn-udn1 (NAD tenant/net, plugin kvnet-cni)",
		"attachment net1 (NAD tenant/blue, plugin kvnet-cni)",
		"attachment eth9 (NAD other/br, plugin bridge,tuning)",
		"attachment third (NAD tenant/blue, plugin kvnet-cni)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("attachments\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !atts[0].primary || atts[1].primary {
		t.Fatal("only the primary network is primary")
	}
}

// In Multus mode the cluster default network is eth0, and the primary
// network is attached only where the networks annotation selects it.
func TestAttachmentsMultusMode(t *testing.T) {
	r := fakeReader(t, true, map[string]string{"tenant/net": kvnetPrimary, "tenant/blue": kvnetSecond})
	def, err := parseConfig([]byte(`{"cniVersion":"1.0.0","name":"cluster-default","type":"bridge"}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		networks string
		want     []string
	}{
		{"", []string{"attachment eth0 (NAD cluster-default, plugin bridge)"}},
		{"net@ovn-udn1, blue", []string{"attachment eth0 (NAD cluster-default, plugin bridge)",
			"attachment ovn-udn1 (NAD tenant/net, plugin kvnet-cni)", "attachment net2 (NAD tenant/blue, plugin kvnet-cni)"}},
	} {
		atts, err := attachments(context.Background(), r, pod(tc.networks), def)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, a := range atts {
			got = append(got, a.String())
		}
		if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
			t.Errorf("networks %q: attachments\n%s\nwant\n%s", tc.networks, strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
		}
		if !atts[0].clusterDefault || len(atts) > 1 && !atts[1].primary {
			t.Errorf("networks %q: cluster default / primary marks wrong", tc.networks)
		}
	}
}

func TestAttachmentsElementOptions(t *testing.T) {
	r := fakeReader(t, false, map[string]string{"tenant/blue": kvnetSecond})
	atts, err := attachments(context.Background(), r, pod(`[{"name":"blue","ips":["10.1.0.9/24"],"mac":"02:00:00:00:00:09","cni-args":{"foo":"bar"}}]`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(atts) != 1 || atts[0].ifName != "net1" {
		t.Fatalf("attachments %v", atts)
	}
	a := atts[0]
	if ips, _ := a.capArgs["ips"].([]string); len(ips) != 1 || a.capArgs["mac"] != "02:00:00:00:00:09" {
		t.Fatalf("capability args %v", a.capArgs)
	}
	var conf struct {
		Args struct {
			CNI map[string]any `json:"cni"`
		} `json:"args"`
	}
	if err := json.Unmarshal(a.list.Plugins[0].Bytes, &conf); err != nil || conf.Args.CNI["foo"] != "bar" {
		t.Fatalf("cni-args not in the plugin configuration: %s (%v)", a.list.Plugins[0].Bytes, err)
	}
}

func TestAttachmentErrors(t *testing.T) {
	for _, tc := range []struct {
		name      string
		labelled  bool
		nads      map[string]string
		networks  string
		permanent bool
		want      string
	}{
		{"bad annotation", false, nil, "Not Valid!", true, "annotation k8s.v1.cni.cncf.io/networks element 0"},
		{"bad JSON", false, nil, `[{"name":`, true, "annotation k8s.v1.cni.cncf.io/networks"},
		{"missing NAD", false, nil, "blue", false, "network attachment definition tenant/blue not found"},
		{"no primary NAD yet", true, map[string]string{"tenant/blue": kvnetSecond}, "", false, "no primary kvnet-cni network attachment definition"},
		{"bad config", false, map[string]string{"tenant/blue": `{"type":`}, "blue", false, "tenant/blue: spec.config"},
		{"interface twice", false, map[string]string{"tenant/blue": kvnetSecond, "other/br": bridgeList}, "blue@x, other/br@x", true, `interface "x" is used twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := attachments(context.Background(), fakeReader(t, tc.labelled, tc.nads), pod(tc.networks), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			var perm *permanentError
			if errors.As(err, &perm) != tc.permanent {
				t.Fatalf("error %v: permanent %v, want %v", err, !tc.permanent, tc.permanent)
			}
		})
	}
}

func TestPluginError(t *testing.T) {
	exitErr := exec.Command("false").Run()
	err := pluginError("/opt/cni/bin/kvnet-cni", "node", exitErr, []byte(`{"cniVersion":"1.1.0","code":11,"msg":"allocation not found","details":"no allocation"}`), nil)
	var e *types.Error
	if !errors.As(err, &e) || e.Code != 11 || e.Msg != "allocation not found" || e.Details != "no allocation" {
		t.Fatalf("CNI error not decoded: %#v", err)
	}
	err = pluginError("/opt/cni/bin/kvnet-cni", "node", exitErr, []byte("garbage"), []byte(`Cannot open network namespace "node": No such file or directory`))
	if errors.As(err, &e) || !strings.Contains(err.Error(), "run plugin kvnet-cni in netns node") || !strings.Contains(err.Error(), "Cannot open network namespace") {
		t.Fatalf("error %v", err)
	}
}

func TestPodIPs(t *testing.T) {
	zero, one := 0, 1
	res := &current.Result{
		Interfaces: []*current.Interface{{Name: "kvp1"}, {Name: "ovn-udn1", Sandbox: "/run/netns/x"}},
		IPs: []*current.IPConfig{
			{Interface: &zero, Address: net.IPNet{IP: net.ParseIP("192.0.2.1"), Mask: net.CIDRMask(24, 32)}},
			{Interface: &one, Address: net.IPNet{IP: net.ParseIP("10.0.0.5").To4(), Mask: net.CIDRMask(24, 32)}},
			{Interface: &one, Address: net.IPNet{IP: net.ParseIP("fd00::5"), Mask: net.CIDRMask(64, 128)}},
			{Interface: &one, Address: net.IPNet{IP: net.ParseIP("10.0.0.6").To4(), Mask: net.CIDRMask(24, 32)}},
		},
	}
	if got := strings.Join(podIPs(res), ","); got != "10.0.0.5,fd00::5" {
		t.Fatalf("pod IPs %s", got)
	}
	if podIPs(nil) != nil {
		t.Fatal("IPs without a result")
	}
}

func TestNSName(t *testing.T) {
	p := pod("")
	if got := PodNetNS(Config{PodNetNSPrefix: "lab-n1-pod-"}, p); got != "/run/netns/lab-n1-pod-0b3c2a1daaaa" {
		t.Fatalf("PodNetNS %s", got)
	}
}
