package epmirror_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"kvnet.io/kvnet/internal/k8s/controllers/epmirror"
	"kvnet.io/kvnet/internal/podnetworks"
)

// TestMirrorEndpoints: each endpoint gets its pod's addresses of the
// slice's family on the network; a host-network pod keeps its own; a pod
// without an address there, a pod that is gone or was replaced (another
// UID), and an endpoint that is no pod are left out.
func TestMirrorEndpoints(t *testing.T) {
	pod := func(name, uid, annotation string, host bool) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("u-" + uid), Annotations: map[string]string{podnetworks.Annotation: annotation}},
			Spec: corev1.PodSpec{HostNetwork: host}}
	}
	dual := `{"ns/udn":{"network":"ns_udn","role":"primary","ip_addresses":["10.1.0.3/24","fd00::3/64"],"mac_address":"0a:58:0a:01:00:03"}}`
	pods := map[string]*corev1.Pod{
		"a":    pod("a", "a", dual, false),
		"host": pod("host", "host", "", true),
		"none": pod("none", "none", `{"ns/other":{"network":"other","role":"secondary","ip_addresses":["10.9.0.3/24"],"mac_address":"0a:58:0a:09:00:03"}}`, false),
		"new":  pod("new", "new", dual, false),
	}
	ep := func(addr, name, uid string) discoveryv1.Endpoint {
		e := discoveryv1.Endpoint{Addresses: []string{addr}}
		if name != "" {
			e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Name: name, UID: types.UID("u-" + uid)}
		}
		return e
	}
	src := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-abc", ResourceVersion: "42",
		Labels: map[string]string{discoveryv1.LabelServiceName: "web"}}, AddressType: discoveryv1.AddressTypeIPv6,
		Endpoints: []discoveryv1.Endpoint{ep("fd99::1", "a", "a"), ep("fd99::2", "host", "host"), ep("fd99::3", "none", "none"),
			ep("fd99::4", "gone", "gone"), ep("fd99::5", "new", "old"), ep("fd99::6", "", "")}}
	m := epmirror.Mirror(src, "ns_udn", func(name string) *corev1.Pod { return pods[name] })
	var got []string
	for _, e := range m.Endpoints {
		got = append(got, e.TargetRef.Name+"="+strings.Join(e.Addresses, ","))
	}
	if want := "a=fd00::3 host=fd99::2"; strings.Join(got, " ") != want {
		t.Errorf("endpoints %q, want %q", strings.Join(got, " "), want)
	}
	if m.Labels[epmirror.ServiceNameLabel] != "web" || m.Labels[epmirror.SourceVersionLabel] != "42" ||
		m.Annotations[epmirror.SourceAnnotation] != "web-abc" || m.Annotations[epmirror.NetworkAnnotation] != "ns_udn" || m.AddressType != discoveryv1.AddressTypeIPv6 {
		t.Errorf("mirror metadata %v %v %s", m.Labels, m.Annotations, m.AddressType)
	}
}

// TestMirrorName: mirror names are valid object names, distinct for
// distinct long sources.
func TestMirrorName(t *testing.T) {
	long := strings.Repeat("a", 250)
	a, b := epmirror.MirrorName(long+"x"), epmirror.MirrorName(long+"y")
	for _, n := range []string{epmirror.MirrorName("web-abc"), a, b} {
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			t.Errorf("%q: %v", n, errs)
		}
	}
	if a == b {
		t.Error("two long sources share a mirror name")
	}
	if epmirror.MirrorName("web-abc") != "kvnet-web-abc" {
		t.Errorf("MirrorName(web-abc) = %q", epmirror.MirrorName("web-abc"))
	}
}
