package vmclaims_test

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kvnet.io/kvnet/internal/ipam"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/vmclaims"
)

func podWith(ann map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "virt-launcher-vm1-x", Annotations: ann}}
}

// KubeVirt's rebuild of the networks annotation (hot plug) carries no
// claim references and no primary element; KeepOnUpdate puts back what
// kvnet wrote, and nothing the update removed otherwise.
func TestKeepOnUpdate(t *testing.T) {
	old := podWith(map[string]string{
		multus.NetworksAnnotation: `[{"name":"tenant","namespace":"ns","interface":"ovn-udn1","ipam-claim-reference":"vm1.podnet","mac":"02:00:00:00:00:01"},` +
			`{"name":"blue","namespace":"ns","interface":"pod1","ipam-claim-reference":"vm1.blue"},` +
			`{"name":"gone","namespace":"ns","interface":"pod2","ipam-claim-reference":"vm1.gone"}]`,
		multus.DefaultNetworkAnnotation:   "x",
		ipam.LegacyPrimaryClaimAnnotation: "vm1.podnet",
	})
	for _, tc := range []struct {
		name, networks string
		dropOthers     bool
		want           string
	}{
		{"hot plug", `[{"name":"blue","namespace":"ns","interface":"pod1"},{"name":"gone","namespace":"ns","interface":"pod2"},{"name":"red","namespace":"ns","interface":"pod3"}]`, false,
			`[{"name":"tenant","namespace":"ns","mac":"02:00:00:00:00:01","interface":"ovn-udn1","ipam-claim-reference":"vm1.podnet"},` +
				`{"name":"blue","namespace":"ns","interface":"pod1","ipam-claim-reference":"vm1.blue"},` +
				`{"name":"gone","namespace":"ns","interface":"pod2","ipam-claim-reference":"vm1.gone"},{"name":"red","namespace":"ns","interface":"pod3"}]`},
		{"unplug", `[{"name":"blue","namespace":"ns","interface":"pod1"}]`, true,
			`[{"name":"tenant","namespace":"ns","mac":"02:00:00:00:00:01","interface":"ovn-udn1","ipam-claim-reference":"vm1.podnet"},` +
				`{"name":"blue","namespace":"ns","interface":"pod1","ipam-claim-reference":"vm1.blue"}]`},
		{"all unplugged", "", true,
			`[{"name":"tenant","namespace":"ns","mac":"02:00:00:00:00:01","interface":"ovn-udn1","ipam-claim-reference":"vm1.podnet"}]`},
		{"another interface is another attachment", `[{"name":"blue","namespace":"ns","interface":"pod9"}]`, false,
			`[{"name":"tenant","namespace":"ns","mac":"02:00:00:00:00:01","interface":"ovn-udn1","ipam-claim-reference":"vm1.podnet"},{"name":"blue","namespace":"ns","interface":"pod9"}]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ann := map[string]string{multus.NetworksAnnotation: tc.networks}
			if !tc.dropOthers {
				ann[multus.DefaultNetworkAnnotation], ann[ipam.LegacyPrimaryClaimAnnotation] = "x", "vm1.podnet"
			}
			got, changed, err := vmclaims.KeepOnUpdate(old, podWith(ann))
			if err != nil || !changed {
				t.Fatalf("changed=%v err=%v", changed, err)
			}
			if got[multus.NetworksAnnotation] != tc.want {
				t.Errorf("networks\n%s\nwant\n%s", got[multus.NetworksAnnotation], tc.want)
			}
			if got[multus.DefaultNetworkAnnotation] != "x" || got[ipam.LegacyPrimaryClaimAnnotation] != "vm1.podnet" {
				t.Errorf("primary claim annotations not kept: %v", got)
			}
		})
	}
	// Nothing to keep: unchanged.
	same := podWith(map[string]string{"other": "1"})
	if got, changed, err := vmclaims.KeepOnUpdate(podWith(nil), same); changed || err != nil || len(got) != 1 {
		t.Errorf("pod without kvnet's annotations: %v changed=%v err=%v", got, changed, err)
	}
	// A new annotation that does not parse is kept as it came, with the
	// error naming the annotation.
	bad := podWith(map[string]string{multus.NetworksAnnotation: "[{"})
	got, _, err := vmclaims.KeepOnUpdate(old, bad)
	if !errors.Is(err, multus.ErrInvalidSelection) || !strings.Contains(err.Error(), multus.NetworksAnnotation) || got[multus.NetworksAnnotation] != "[{" {
		t.Errorf("unparsable update: %v, %v", got, err)
	}
}

func TestKvnetAnnotationsChanged(t *testing.T) {
	old := podWith(map[string]string{multus.NetworksAnnotation: "a", "x": "1"})
	for _, tc := range []struct {
		ann  map[string]string
		want bool
	}{
		{map[string]string{multus.NetworksAnnotation: "a", "x": "2", "y": "3"}, false},
		{map[string]string{multus.NetworksAnnotation: "b", "x": "1"}, true},
		{map[string]string{"x": "1"}, true},
		{map[string]string{multus.NetworksAnnotation: "a", multus.DefaultNetworkAnnotation: ""}, true},
		{map[string]string{multus.NetworksAnnotation: "a", ipam.LegacyPrimaryClaimAnnotation: "c"}, true},
	} {
		if got := vmclaims.KvnetAnnotationsChanged(old, podWith(tc.ann)); got != tc.want {
			t.Errorf("%v -> %v: changed=%v, want %v", old.Annotations, tc.ann, got, tc.want)
		}
	}
}

// FuzzKeepOnUpdate: any pair of annotation values is handled without a
// panic; without an error, the result parses and selects every NAD the
// update selected.
func FuzzKeepOnUpdate(f *testing.F) {
	f.Add(`[{"name":"tenant","namespace":"ns","interface":"ovn-udn1"}]`, `[{"name":"blue"}]`)
	f.Add(`a, b@eth1`, `[{"name":"a","ipam-claim-reference":"c"}]`)
	f.Add(`[{`, ``)
	f.Add(``, `{"name":"x"}`)
	f.Fuzz(func(t *testing.T, oldV, newV string) {
		old := podWith(map[string]string{multus.NetworksAnnotation: oldV})
		got, _, err := vmclaims.KeepOnUpdate(old, podWith(map[string]string{multus.NetworksAnnotation: newV}))
		if err != nil {
			if got[multus.NetworksAnnotation] != newV {
				t.Fatalf("error %v, and the annotation changed to %q", err, got[multus.NetworksAnnotation])
			}
			return
		}
		elems, err := multus.ParseSelection(multus.NetworksAnnotation, got[multus.NetworksAnnotation], "ns")
		if err != nil {
			t.Fatalf("result %q does not parse: %v", got[multus.NetworksAnnotation], err)
		}
		in, _ := multus.ParseSelection(multus.NetworksAnnotation, newV, "ns")
		keys := map[string]bool{}
		for _, e := range elems {
			keys[e.Key()] = true
		}
		for _, e := range in {
			if !keys[e.Key()] {
				t.Fatalf("update selected %s, result %q does not", e.Key(), got[multus.NetworksAnnotation])
			}
		}
	})
}
