package udn_test

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/udn"
)

func handwritten(ns, name, config string) *nadv1.NetworkAttachmentDefinition {
	nad := &nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	nad.Spec.Config = config
	return nad
}

// waitEventMessage waits for an event of reason with exactly msg
// regarding obj.
func waitEventMessage(t *testing.T, obj client.Object, eventType, reason, msg string) {
	t.Helper()
	testenv.Eventually(t, timeout, fmt.Sprintf("%s event %s on %s", eventType, reason, obj.GetName()), func() error {
		var list eventsv1.EventList
		if err := c.List(context.Background(), &list, client.InNamespace(obj.GetNamespace())); err != nil {
			return err
		}
		var seen []string
		for _, ev := range list.Items {
			if ev.Regarding.UID != obj.GetUID() {
				continue
			}
			if ev.Type == eventType && ev.Reason == reason && ev.Note == msg {
				return nil
			}
			seen = append(seen, fmt.Sprintf("%s/%s %q", ev.Type, ev.Reason, ev.Note))
		}
		return fmt.Errorf("not recorded; events on it: %v", seen)
	})
}

// waitConflict waits for nad's kvnet.io/network-conflict annotation to be
// want ("" = absent) and returns the NAD.
func waitConflict(t *testing.T, nad *nadv1.NetworkAttachmentDefinition, want string) *nadv1.NetworkAttachmentDefinition {
	t.Helper()
	var got *nadv1.NetworkAttachmentDefinition
	testenv.Eventually(t, timeout, "conflict mark of "+nad.Namespace+"/"+nad.Name, func() (err error) {
		if got, err = getNAD(nad.Namespace, nad.Name); err != nil {
			return err
		}
		if have := got.Annotations[udn.NetworkConflictAnnotation]; have != want {
			return fmt.Errorf("annotation %s = %q, want %q", udn.NetworkConflictAnnotation, have, want)
		}
		return nil
	})
	return got
}

// TestNADAgreement: two NADs that name the same network must agree on it
// (as OVN-Kubernetes requires): the later one is refused, marked with
// kvnet.io/network-conflict naming every difference and a Warning
// NetworkConfigMismatch event, and gets no network ID; the first keeps its
// ID, and a NAD that agrees is served. Once the refused NAD agrees, the
// mark goes.
func TestNADAgreement(t *testing.T) {
	mkNS(t, "agree-a", nil)
	mkNS(t, "agree-b", nil)
	first := handwritten("agree-a", "first", `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"agreed","netAttachDefName":"agree-a/first","topology":"layer2","subnets":"10.63.0.0/24","mtu":1400}`)
	create(t, first)
	var id int
	testenv.Eventually(t, timeout, "the first NAD is served", func() error {
		got, err := getNAD("agree-a", "first")
		if err != nil {
			return err
		}
		if id = udn.NetworkIDOf(got); id == 0 {
			return fmt.Errorf("no network ID yet")
		}
		return nil
	})

	second := handwritten("agree-b", "second", `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"agreed","netAttachDefName":"agree-b/second","topology":"layer2","subnets":"10.64.0.0/24","mtu":9000}`)
	create(t, second)
	const msg = `NAD agree-b/second CNI config does not match that of network agreed, which NAD agree-a/first defined first: ` +
		`"mtu": "1400" vs "9000", "subnets": "10.63.0.0/24" vs "10.64.0.0/24"; ` +
		`kvnet serves the network as agree-a/first defines it, and no pod gets an interface from this NAD until it agrees`
	got := waitConflict(t, second, msg)
	waitEventMessage(t, second, corev1.EventTypeWarning, "NetworkConfigMismatch", msg)
	if udn.NetworkIDOf(got) != 0 {
		t.Errorf("the refused NAD got a network ID: %v", got.Annotations)
	}

	// A third NAD that agrees (other namespace, other spelling) is served
	// with the network's ID; the first is untouched.
	third := handwritten("agree-b", "third", `{"cniVersion":"0.4.0","type":"kvnet-cni","name":"agreed","netAttachDefName":"agree-b/third","topology":"layer2","role":"secondary","subnets":"10.63.0.0/24","mtu":1400}`)
	create(t, third)
	testenv.Eventually(t, timeout, "the agreeing NAD is served", func() error {
		got, err := getNAD("agree-b", "third")
		if err != nil {
			return err
		}
		if udn.NetworkIDOf(got) != id {
			return fmt.Errorf("network ID %d, want the network's %d", udn.NetworkIDOf(got), id)
		}
		return nil
	})
	if got := waitConflict(t, first, ""); udn.NetworkIDOf(got) != id {
		t.Errorf("the first NAD lost its network ID: %v", got.Annotations)
	}
	waitConflict(t, third, "")

	// The refused NAD, corrected, is served.
	got, err := getNAD("agree-b", "second")
	if err != nil {
		t.Fatal(err)
	}
	got.Spec.Config = `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"agreed","netAttachDefName":"agree-b/second","topology":"layer2","subnets":"10.63.0.0/24","mtu":1400}`
	if err := c.Update(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	waitConflict(t, second, "")
}

// TestHandwrittenLocalnetDefault: a hand-written localnet NAD without
// "physicalNetworkName" (the docs' localnet NADs, retyped to kvnet-cni)
// is served on the physical network of its network's name, as
// OVN-Kubernetes does: the NoBridgeMapping warning names that network.
func TestHandwrittenLocalnetDefault(t *testing.T) {
	const ns = "hw-localnet"
	mkNS(t, ns, nil)
	nad := handwritten(ns, "tenantblue", `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"hwtenantblue","netAttachDefName":"hw-localnet/tenantblue","topology":"localnet","subnets":"192.168.99.0/24"}`)
	create(t, nad)
	waitEventMessage(t, nad, corev1.EventTypeWarning, "NoBridgeMapping",
		`no node maps physical network "hwtenantblue" to a bridge: annotate the nodes on that network with kvnet.io/bridge-mappings=hwtenantblue:<bridge>`)
}
