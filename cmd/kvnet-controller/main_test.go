package main

import (
	"strings"
	"testing"

	"kvnet.io/kvnet/internal/k8s/manager"
)

func TestCheckDefaultNetworkNAD(t *testing.T) {
	for _, tc := range []struct {
		mode, nad string
		err       string // substring; "" means valid
	}{
		{manager.PrimaryByMultus, "", ""},
		{manager.PrimaryByMultus, "junk", ""},
		{manager.PrimaryByDefaultNetwork, "ovn-kubernetes/default", ""},
		{manager.PrimaryByDefaultNetwork, "", "--default-network-nad is required with --primary-network-attachment=default-network"},
		{manager.PrimaryByDefaultNetwork, "default", `--default-network-nad "default": want <namespace>/<name>`},
		{manager.PrimaryByDefaultNetwork, "/default", `--default-network-nad "/default"`},
		{manager.PrimaryByDefaultNetwork, "a/b/c", `--default-network-nad "a/b/c"`},
	} {
		err := checkDefaultNetworkNAD(tc.mode, tc.nad)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s %q: %v", tc.mode, tc.nad, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s %q: error %v, want it to contain %q", tc.mode, tc.nad, err, tc.err)
		}
	}
}
