package why

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/udn"
)

// Builders of the objects the tests seed, shaped as kvnet-controller,
// KubeVirt and the kubelet write them.

func namespace(name string, labelled bool) *corev1.Namespace {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if labelled {
		ns.Labels = map[string]string{udn.PrimaryNamespaceLabel: ""}
	}
	return ns
}

// netConf is a kvnet-cni configuration as the UDN controller renders it.
type netConf struct {
	topology, role, subnets string
	persistent              bool
}

func (c netConf) render(ns, name string) string {
	m := map[string]any{
		"cniVersion": "1.1.0", "type": "kvnet-cni", "name": ns + "_" + name,
		"netAttachDefName": ns + "/" + name, "topology": orDefault(c.topology, "layer2"), "role": orDefault(c.role, "primary"),
	}
	if c.subnets != "" {
		m["subnets"] = c.subnets
	}
	if c.persistent {
		m["allowPersistentIPs"] = true
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func nadWith(ns, name, config string) *nadv1.NetworkAttachmentDefinition {
	return &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: config},
	}
}

func kvnetNAD(ns, name string, c netConf) *nadv1.NetworkAttachmentDefinition {
	return nadWith(ns, name, c.render(ns, name))
}

func claim(ns, name, network string, owner *vmRef, ips ...string) *ipamclaimv1alpha1.IPAMClaim {
	cl := &ipamclaimv1alpha1.IPAMClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       ipamclaimv1alpha1.IPAMClaimSpec{Network: network},
		Status:     ipamclaimv1alpha1.IPAMClaimStatus{IPs: ips},
	}
	if owner != nil {
		t := true
		cl.OwnerReferences = []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: owner.Kind, Name: owner.Name, UID: owner.UID, Controller: &t, BlockOwnerDeletion: &t}}
		cl.Labels = map[string]string{kubevirtv1.VirtualMachineLabel: owner.Name}
	}
	if len(ips) > 0 {
		cl.Status.Conditions = []metav1.Condition{{Type: "IPsAllocated", Status: metav1.ConditionTrue, Reason: "SuccessfulAllocation", Message: "IP addresses successfully allocated", LastTransitionTime: metav1.Now()}}
	}
	return cl
}

func plainPod(ns, name, node string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations, UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
}

// selection renders a networks annotation element list.
func selection(elems ...multus.NetworkSelectionElement) string {
	s, _ := multus.MarshalSelection(elems)
	return s
}

// allocated renders a kvnet.io/pod-networks value with one attachment.
func allocated(nadKey, network, role, ip, claimName string) string {
	a := podnetworks.Attachment{IPAddresses: []string{ip}, MACAddress: "0a:58:0a:00:00:05", Role: role, Network: network, IPAMClaim: claimName}
	if role == podnetworks.RolePrimary {
		a.GatewayIPs = []string{"10.0.0.1"}
		a.Routes = []podnetworks.Route{{Dest: "0.0.0.0/0", NextHop: "10.0.0.1"}}
	}
	v, err := podnetworks.Networks{nadKey: a}.Marshal()
	if err != nil {
		panic(err)
	}
	return v
}

func node(name string, vtep string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if vtep != "" {
		n.Annotations = map[string]string{vtepAnnotation: vtep}
	}
	return n
}

// agentPod is a kvnet-node DaemonSet pod on node.
func agentPod(ns, nodeName string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kvnet-node-" + nodeName, Labels: map[string]string{agentLabelKey: agentLabelValue}},
		Spec:       corev1.PodSpec{NodeName: nodeName, HostNetwork: true, Containers: []corev1.Container{{Name: "node", Image: "kvnet-node"}}},
	}
}

func setReady(p *corev1.Pod, ready bool) {
	st := corev1.ConditionTrue
	reason := ""
	if !ready {
		st, reason = corev1.ConditionFalse, "ContainersNotReady"
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st, Reason: reason, LastTransitionTime: metav1.Now()}}
}

// vmSpec is a VMI spec with one interface per network.
type vmIface struct {
	name    string
	binding string // "l2bridge", "bridge", "masquerade", "sriov"
	nad     string // "" for the pod network
}

func vmiSpec(ifaces ...vmIface) kubevirtv1.VirtualMachineInstanceSpec {
	var spec kubevirtv1.VirtualMachineInstanceSpec
	for _, i := range ifaces {
		iface := kubevirtv1.Interface{Name: i.name}
		switch i.binding {
		case "bridge":
			iface.Bridge = &kubevirtv1.InterfaceBridge{}
		case "masquerade":
			iface.Masquerade = &kubevirtv1.InterfaceMasquerade{}
		case "sriov":
			iface.SRIOV = &kubevirtv1.InterfaceSRIOV{}
		default:
			iface.Binding = &kubevirtv1.PluginBinding{Name: i.binding}
		}
		spec.Domain.Devices.Interfaces = append(spec.Domain.Devices.Interfaces, iface)
		n := kubevirtv1.Network{Name: i.name}
		if i.nad == "" {
			n.Pod = &kubevirtv1.PodNetwork{}
		} else {
			n.Multus = &kubevirtv1.MultusNetwork{NetworkName: i.nad}
		}
		spec.Networks = append(spec.Networks, n)
	}
	return spec
}

func kubeVirtCR(bindings ...string) *kubevirtv1.KubeVirt {
	kv := &kubevirtv1.KubeVirt{ObjectMeta: metav1.ObjectMeta{Namespace: "kubevirt", Name: "kubevirt"}}
	kv.Spec.Configuration.NetworkConfiguration = &kubevirtv1.NetworkConfiguration{Binding: map[string]kubevirtv1.InterfaceBindingPlugin{}}
	for _, b := range bindings {
		kv.Spec.Configuration.NetworkConfiguration.Binding[b] = kubevirtv1.InterfaceBindingPlugin{DomainAttachmentType: domainAttachmentManagedTap}
	}
	return kv
}

// testPKI is a CA and a serving certificate signed by it, PEM encoded as
// kvnet-controller stores them (EC keys).
type testPKI struct {
	caPEM, caKeyPEM, certPEM, keyPEM []byte
}

func newPKI(t testing.TB, notAfter time.Time, ips []net.IP, dnsNames ...string) testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: fmt.Sprintf("test-ca-%d", time.Now().UnixNano())},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(10 * 365 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano() + 1), Subject: pkix.Name{CommonName: "kvnet-webhook"},
		DNSNames: dnsNames, IPAddresses: ips, NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	enc := func(typ string, b []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}) }
	caKeyDER, _ := x509.MarshalECPrivateKey(caKey)
	keyDER, _ := x509.MarshalECPrivateKey(key)
	return testPKI{caPEM: enc("CERTIFICATE", caDER), caKeyPEM: enc("EC PRIVATE KEY", caKeyDER), certPEM: enc("CERTIFICATE", leafDER), keyPEM: enc("EC PRIVATE KEY", keyDER)}
}

func (p testPKI) secret(ns string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: certSecretName},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{"ca.crt": p.caPEM, "ca.key": p.caKeyPEM, "tls.crt": p.certPEM, "tls.key": p.keyPEM},
	}
}

// webhookConfig is kvnet-mutator with both webhooks calling url (or the
// Service when url is "") and caBundle.
func webhookConfig(url string, caBundle []byte, policy admissionregistrationv1.FailurePolicyType) *admissionregistrationv1.MutatingWebhookConfiguration {
	none := admissionregistrationv1.SideEffectClassNone
	timeout := int32(2)
	mk := func(name, path string) admissionregistrationv1.MutatingWebhook {
		w := admissionregistrationv1.MutatingWebhook{
			Name: name, AdmissionReviewVersions: []string{"v1"}, SideEffects: &none, FailurePolicy: &policy, TimeoutSeconds: &timeout,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: caBundle},
		}
		if url != "" {
			u := url + path
			w.ClientConfig.URL = &u
		} else {
			p := path
			w.ClientConfig.Service = &admissionregistrationv1.ServiceReference{Namespace: "kvnet-system", Name: "kvnet-webhook", Path: &p}
		}
		return w
	}
	launcher := mk(webhookLauncher, "/mutate-launcher-pod")
	launcher.Rules = []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
	}}
	launcher.ObjectSelector = &metav1.LabelSelector{MatchLabels: map[string]string{kubevirtv1.AppLabel: kubevirtv1.VirtLauncherValue}}
	vms := mk(webhookVMs, "/mutate-virtualmachines")
	vms.Rules = []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{"kubevirt.io"}, APIVersions: []string{"v1"}, Resources: []string{"virtualmachines"}},
	}}
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "kvnet-mutator", Labels: map[string]string{"kvnet.io/inject-ca": "true"}},
		Webhooks:   []admissionregistrationv1.MutatingWebhook{launcher, vms},
	}
}
