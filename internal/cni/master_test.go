package cni

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/containernetworking/cni/pkg/types"
)

func TestClusterDefaultNetwork(t *testing.T) {
	for _, tt := range []struct {
		name  string
		files map[string]string
		want  string // the chosen network's name; "" for errNoDefaultNetwork
	}{
		{"first past Multus and kvnet", map[string]string{
			"00-multus.conf":      `{"cniVersion":"1.0.0","name":"multus-cni-network","type":"multus-shim"}`,
			"05-kvnet.conflist":   `{"cniVersion":"1.0.0","name":"k","plugins":[{"type":"kvnet-cni"}]}`,
			"10-flannel.conflist": `{"cniVersion":"1.0.0","name":"cbr0","plugins":[{"type":"flannel"},{"type":"portmap"}]}`,
			"20-other.conf":       `{"cniVersion":"1.0.0","name":"other","type":"bridge"}`,
		}, "cbr0"},
		{"a single configuration", map[string]string{
			"10-bridge.conf": `{"cniVersion":"1.0.0","name":"br","type":"bridge"}`,
		}, "br"},
		{"an unparsable file is passed over", map[string]string{
			"01-broken.conflist": `{"plugins":`,
			"10-bridge.json":     `{"cniVersion":"1.0.0","name":"br","type":"bridge"}`,
		}, "br"},
		{"only Multus", map[string]string{
			"00-multus.conf": `{"cniVersion":"1.0.0","name":"multus-cni-network","type":"multus"}`,
			"notes.txt":      `{"cniVersion":"1.0.0","name":"x","type":"bridge"}`,
		}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for n, d := range tt.files {
				if err := os.WriteFile(filepath.Join(dir, n), []byte(d), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			list, _, err := clusterDefaultNetwork(dir)
			if tt.want == "" {
				if !errors.Is(err, errNoDefaultNetwork) || !strings.Contains(err.Error(), dir) {
					t.Fatalf("got %v, want errNoDefaultNetwork naming %s", err, dir)
				}
				return
			}
			if err != nil || list.Name != tt.want {
				t.Fatalf("got %v, %v; want network %q", list, err, tt.want)
			}
		})
	}
}

func TestMergeDefault(t *testing.T) {
	two, one := 2, 1
	def := &current.Result{
		Interfaces: []*current.Interface{{Name: "cni0"}, {Name: "veth1"}, {Name: "eth0", Sandbox: "/ns"}},
		IPs: []*current.IPConfig{{Interface: &two, Address: net.IPNet{IP: net.IPv4(10, 244, 1, 5), Mask: net.CIDRMask(24, 32)},
			Gateway: net.IPv4(10, 244, 1, 1)}},
		Routes: []*types.Route{
			{Dst: net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}, GW: net.IPv4(10, 244, 1, 1)},
			{Dst: net.IPNet{IP: net.IPv4(10, 244, 0, 0), Mask: net.CIDRMask(16, 32)}, GW: net.IPv4(10, 244, 1, 1)},
		},
	}
	own := &current.Result{
		Interfaces: []*current.Interface{{Name: "kvp0"}, {Name: "ovn-udn1", Sandbox: "/ns"}},
		IPs: []*current.IPConfig{{Interface: &one, Address: net.IPNet{IP: net.IPv4(10, 100, 0, 3), Mask: net.CIDRMask(24, 32)},
			Gateway: net.IPv4(10, 100, 0, 1)}},
	}
	m := mergeDefault(def, own)
	if len(m.Interfaces) != 5 || m.Interfaces[4].Name != "ovn-udn1" {
		t.Fatalf("interfaces %v", m.Interfaces)
	}
	if m.IPs[0].Gateway != nil || *m.IPs[0].Interface != 2 {
		t.Errorf("eth0's address: gateway %v interface %d, want none and 2", m.IPs[0].Gateway, *m.IPs[0].Interface)
	}
	if !m.IPs[1].Gateway.Equal(net.IPv4(10, 100, 0, 1)) || *m.IPs[1].Interface != 4 {
		t.Errorf("ovn-udn1's address: gateway %v interface %d, want 10.100.0.1 and 4", m.IPs[1].Gateway, *m.IPs[1].Interface)
	}
	if len(m.Routes) != 1 || m.Routes[0].Dst.String() != "10.244.0.0/16" {
		t.Errorf("routes %v, want the default network's default route dropped", m.Routes)
	}
	if def.IPs[0].Gateway == nil || *own.IPs[0].Interface != 1 {
		t.Error("mergeDefault changed its inputs")
	}
}

func TestParseAttachDefaultNetwork(t *testing.T) {
	const primary = `{"cniVersion":"1.0.0","name":"ns_net","type":"kvnet-cni","topology":"layer2","role":"primary","subnets":"10.0.0.0/24","netAttachDefName":"ns/net"`
	const secondary = `{"cniVersion":"1.0.0","name":"ns_net","type":"kvnet-cni","topology":"layer2","role":"secondary","subnets":"10.0.0.0/24","netAttachDefName":"ns/net"`
	for _, tt := range []struct {
		name, conf, err string
		want            bool
	}{
		{"set", primary + `,"args":{"cni":{"kvnet.io/attach-default-network":true}}}`, "", true},
		{"absent", primary + `}`, "", false},
		{"other args", primary + `,"args":{"cni":{"x":1}}}`, "", false},
		{"not a bool", primary + `,"args":{"cni":{"kvnet.io/attach-default-network":"yes"}}}`, `args.cni["kvnet.io/attach-default-network"] "yes": want true or false`, false},
		{"secondary", secondary + `,"args":{"cni":{"kvnet.io/attach-default-network":true}}}`, `network "ns_net" is not a primary network`, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, err := parse([]byte(tt.conf))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %v, want an error containing %q", err, tt.err)
				}
				return
			}
			if err != nil || r.attachDefault != tt.want {
				t.Fatalf("got %+v, %v; want attachDefault %v", r, err, tt.want)
			}
		})
	}
}
