package cni

import (
	"testing"

	"kvnet.io/kvnet/internal/datapath"
)

// TestHostIfNameIsKvnets: every host interface name kvnet-cni makes is
// one datapath.Cleanup recognises as kvnet's (kvnet uninstall removes it),
// and the prefix alone is not.
func TestHostIfNameIsKvnets(t *testing.T) {
	for _, tc := range []struct{ ctr, ifName string }{
		{"ctr-1", "ovn-udn1"}, {"0123456789abcdef", "net1"}, {"", "eth0"},
	} {
		if name := HostIfName(tc.ctr, tc.ifName); !datapath.IsPodHostIf(name) {
			t.Errorf("HostIfName(%q, %q) = %q: not recognised by datapath.IsPodHostIf", tc.ctr, tc.ifName, name)
		}
	}
	for _, name := range []string{hostIfPrefix, "kvprobe0", "kvpA1DE679423", "kvpa1de6794231", "kvbr1"} {
		if datapath.IsPodHostIf(name) {
			t.Errorf("datapath.IsPodHostIf(%q) = true, want false", name)
		}
	}
}
