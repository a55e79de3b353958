package why

import (
	"fmt"
	"testing"

	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/udn"
)

// TestWhyNADConfigMismatch: a pod on a NAD that kvnet-controller refused
// for disagreeing with the first NAD of its network is told so, with the
// controller's reason.
func TestWhyNADConfigMismatch(t *testing.T) {
	ns := uniq("mismatch")
	nad := kvnetNAD(ns, "late", netConf{role: "secondary", subnets: "10.1.0.0/24"})
	const reason = `NAD x/late CNI config does not match that of network shared, which NAD y/first defined first: "mtu": "1400" vs "9000"`
	nad.Annotations = map[string]string{udn.NetworkConflictAnnotation: reason}
	create(t, namespace(ns, false), nad)
	pod := seededPod(t, ns, mkNode(t, true), map[string]string{multus.NetworksAnnotation: "late"})
	expectWhy(t, NADConfigMismatch, []string{fmt.Sprintf("names NAD %s/late, which kvnet-controller refused: %s", ns, reason)}, "pod", pod.Name, "-n", ns)
}
