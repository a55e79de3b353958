package why

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	mnpv1beta1 "kvnet.io/kvnet/api/k8scni/v1beta1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/podnetworks"
)

// netPod seeds a pod labelled app=<app> with one kvnet attachment.
func netPod(t *testing.T, ns, app, nadKey, network, role, ip string) *corev1.Pod {
	t.Helper()
	p := plainPod(ns, app, "", map[string]string{podnetworks.Annotation: allocated(nadKey, network, role, ip, "")})
	p.UID = ""
	p.Labels = map[string]string{"app": app}
	create(t, p)
	return p
}

func netPolicy(ns, name string, selected string, types []networkingv1.PolicyType, ingress []networkingv1.NetworkPolicyIngressRule, egress []networkingv1.NetworkPolicyEgressRule) networkingv1.NetworkPolicySpec {
	return networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": selected}},
		PolicyTypes: types, Ingress: ingress, Egress: egress,
	}
}

func tcp(port int) []networkingv1.NetworkPolicyPort {
	p := intstr.FromInt32(int32(port))
	proto := corev1.ProtocolTCP
	return []networkingv1.NetworkPolicyPort{{Protocol: &proto, Port: &p}}
}

func fromApp(app string) []networkingv1.NetworkPolicyPeer {
	return []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}}}
}

// TestWhyConnection seeds two tenants' primary UDNs and a secondary
// network with policies, and asks kvnet why about connections between
// their pods and a VM.
func TestWhyConnection(t *testing.T) {
	ns, other, sec := uniq("conn"), uniq("conn-other"), uniq("conn-sec")
	create(t, namespace(ns, true), namespace(other, true), namespace(sec, false),
		primaryNAD(ns, false), primaryNAD(other, false),
		kvnetNAD(sec, "blue", netConf{role: "secondary", subnets: "10.1.0.0/24"}))
	nad, otherNAD := ns+"/net", other+"/net"
	netPod(t, ns, "web", nad, ns+"_net", podnetworks.RolePrimary, "10.0.0.10/24")
	netPod(t, ns, "client", nad, ns+"_net", podnetworks.RolePrimary, "10.0.0.11/24")
	netPod(t, ns, "intruder", nad, ns+"_net", podnetworks.RolePrimary, "10.0.0.12/24")
	netPod(t, ns, "jailed", nad, ns+"_net", podnetworks.RolePrimary, "10.0.0.13/24")
	netPod(t, other, "web", otherNAD, other+"_net", podnetworks.RolePrimary, "10.0.0.10/24")
	// A VM's launcher pod, labelled as KubeVirt labels it.
	launcher := plainPod(ns, "virt-launcher-db-x1", "", map[string]string{
		podnetworks.Annotation: allocated(nad, ns+"_net", podnetworks.RolePrimary, "10.0.0.20/24", ""), kubevirtv1.DomainAnnotation: "db"})
	launcher.UID = ""
	launcher.Labels = map[string]string{kubevirtv1.AppLabel: kubevirtv1.VirtLauncherValue, "app": "db"}
	create(t, launcher)
	secNAD := sec + "/blue"
	netPod(t, sec, "store", secNAD, sec+"_blue", podnetworks.RoleSecondary, "10.1.0.10/24")
	netPod(t, sec, "near", secNAD, sec+"_blue", podnetworks.RoleSecondary, "10.1.0.4/24")
	netPod(t, sec, "far", secNAD, sec+"_blue", podnetworks.RoleSecondary, "10.1.0.40/24")

	create(t,
		&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-from-client"},
			Spec: netPolicy(ns, "web-from-client", "web", nil, []networkingv1.NetworkPolicyIngressRule{{From: fromApp("client"), Ports: tcp(80)}}, nil)},
		&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db-from-web"},
			Spec: netPolicy(ns, "db-from-web", "db", nil, []networkingv1.NetworkPolicyIngressRule{{From: fromApp("web"), Ports: tcp(5432)}}, nil)},
		&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "jail"},
			Spec: netPolicy(ns, "jail", "jailed", []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}, nil, nil)},
		&mnpv1beta1.MultiNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: sec, Name: "store-from-near",
			Annotations: map[string]string{mnpv1beta1.PolicyForAnnotation: "blue"}},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "store"}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.1.0.0/28"}}}}}}},
		// A CIDR the CRD accepts and the compiler cannot use: the policy
		// fails closed, far is isolated and the rule admits nothing.
		&mnpv1beta1.MultiNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: sec, Name: "far-broken",
			Annotations: map[string]string{mnpv1beta1.PolicyForAnnotation: "blue"}},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "far"}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.1.0.0/33"}}}}}}},
	)

	for _, tc := range []struct {
		name     string
		args     []string
		code     Code
		want     []string
		wantNone []string
	}{
		{"allowed by a named policy", []string{ns + "/client", ns + "/web", "--port", "80"}, "",
			[]string{"healthy: allowed on network " + ns + "_net", "allowed by NetworkPolicy " + ns + "/web-from-client ingress[0]", "10.0.0.11 -> 10.0.0.10"}, nil},
		{"allowed on any port names the port", []string{ns + "/client", ns + "/web"}, "",
			[]string{"allowed by NetworkPolicy " + ns + "/web-from-client ingress[0] on TCP/80"}, nil},
		{"refused by ingress isolation", []string{ns + "/intruder", ns + "/web", "--port", "80"}, PolicyDeniesIngress,
			[]string{"refused: pod " + ns + "/web is isolated for ingress by NetworkPolicy " + ns + "/web-from-client and none of its rules allows TCP/80",
				"add an ingress rule allowing 10.0.0.12 on TCP/80"}, nil},
		{"refused on another port", []string{ns + "/client", ns + "/web", "--port", "81"}, PolicyDeniesIngress,
			[]string{"none of its rules allows TCP/81"}, nil},
		{"refused by egress isolation", []string{ns + "/jailed", ns + "/client", "--port", "80"}, PolicyDeniesEgress,
			[]string{"refused: pod " + ns + "/jailed is isolated for egress by NetworkPolicy " + ns + "/jail"}, nil},
		{"no policy", []string{ns + "/web", ns + "/client", "--port", "80", "--protocol", "udp"}, "",
			[]string{"not isolated for egress", "not isolated for ingress", "UDP/80"}, []string{"allowed by"}},
		{"to a VM by name", []string{"web", "db", "-n", ns, "--port", "5432"}, "",
			[]string{"vm " + ns + "/db (launcher pod virt-launcher-db-x1)", "allowed by NetworkPolicy " + ns + "/db-from-web ingress[0]"}, nil},
		{"different tenants", []string{ns + "/web", other + "/web", "--port", "80"}, DifferentNetworks,
			[]string{"different networks", ns + "_net (primary, NAD " + ns + "/net)", other + "_net (primary, NAD " + other + "/net)"}, nil},
		{"MultiNetworkPolicy allows", []string{sec + "/near", sec + "/store", "--port", "80"}, "",
			[]string{sec + "_blue (secondary): policed by MultiNetworkPolicy, 2 in its namespaces", "allowed by MultiNetworkPolicy " + sec + "/store-from-near ingress[0]"}, nil},
		{"MultiNetworkPolicy refuses", []string{sec + "/far", sec + "/store", "--port", "80"}, PolicyDeniesIngress,
			[]string{"isolated for ingress by MultiNetworkPolicy " + sec + "/store-from-near"}, nil},
		{"a policy that cannot be compiled fails closed", []string{sec + "/near", sec + "/far", "--port", "80"}, PolicyDeniesIngress,
			[]string{"isolated for ingress by MultiNetworkPolicy " + sec + "/far-broken",
				`fails closed  policy "` + sec + `/far-broken" on network "` + sec + `_blue": spec.ingress[0] peer[0].ipBlock.cidr "10.1.0.0/33"`,
				"rule spec.ingress[0] admits nothing"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := expectWhy(t, tc.code, tc.want, append([]string{"connection"}, tc.args...)...)
			t.Log("\n" + out)
			for _, w := range tc.wantNone {
				if strings.Contains(out, w) {
					t.Errorf("output says %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestSharedNetwork(t *testing.T) {
	att := func(network, role string) podnetworks.Attachment {
		return podnetworks.Attachment{Network: network, Role: role, IPAddresses: []string{"10.0.0.4/24"}}
	}
	src := podnetworks.Networks{"a/net": att("a_net", podnetworks.RolePrimary), "a/blue": att("a_blue", podnetworks.RoleSecondary), "a/red": att("a_red", podnetworks.RoleSecondary)}
	dst := podnetworks.Networks{"b/net": att("a_net", podnetworks.RolePrimary), "a/blue": att("a_blue", podnetworks.RoleSecondary), "a/red": att("a_red", podnetworks.RoleSecondary)}
	for _, tc := range []struct {
		want, network string
		primary       bool
		dst           podnetworks.Networks
	}{
		{"", "a_net", true, dst},         // a CUDN's two NADs: one network, primary first
		{"a/red", "a_red", false, dst},   // by NAD
		{"a_blue", "a_blue", false, dst}, // by network name
		{"c/none", "", false, dst},       // not shared
		{"", "a_blue", false, podnetworks.Networks{"a/blue": dst["a/blue"], "a/red": dst["a/red"]}}, // no primary: first by name
		{"", "", false, podnetworks.Networks{"z/net": att("z_net", podnetworks.RolePrimary)}},       // two tenants
	} {
		network, primary := sharedNetwork(src, tc.dst, tc.want)
		if network != tc.network || primary != tc.primary {
			t.Errorf("sharedNetwork(--network %q) = %q, %v; want %q, %v", tc.want, network, primary, tc.network, tc.primary)
		}
	}
}
