package cni

import (
	"strings"
	"testing"

	"kvnet.io/kvnet/internal/podnetworks"
)

func TestHostIfName(t *testing.T) {
	a, b := HostIfName("ctr", "net1"), HostIfName("ctr", "net2")
	if len(a) > 15 || !strings.HasPrefix(a, "kvp") || a == b || a != HostIfName("ctr", "net1") {
		t.Fatalf("names %q %q", a, b)
	}
}

func TestParse(t *testing.T) {
	tests := []struct{ name, stdin, want string }{
		{"not json", `{`, "decode network configuration"},
		{"foreign", `{"cniVersion":"1.0.0","type":"bridge","name":"b"}`, `neither "type": "kvnet-cni" nor "ipam": {"type": "kvnet-ipam"}`},
		{"bad field", `{"type":"kvnet-cni","name":"n","topology":"layer2","subnets":"x"}`, `"subnets" value "x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse([]byte(tt.stdin))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
	r, err := parse([]byte(`{"cniVersion":"1.0.0","type":"bridge","name":"mig","ipam":{"type":"kvnet-ipam","subnets":"10.0.0.0/24","annotationTimeout":"5s"}}`))
	if err != nil || !r.ipamOnly || r.opts.AnnotationTimeout != "5s" {
		t.Fatalf("ipam-only parse: %+v, %v", r, err)
	}
}

func TestFindAndResult(t *testing.T) {
	nets := podnetworks.Networks{
		"ns/a": {IPAddresses: []string{"10.0.0.5/24"}, MACAddress: "0a:58:0a:00:00:05", Role: "primary", Network: "ns_a",
			GatewayIPs: []string{"10.0.0.1"}, Routes: []podnetworks.Route{{Dest: "0.0.0.0/0", NextHop: "10.0.0.1"}}},
		"ns/b": {IPAddresses: []string{"10.1.0.7/16"}, MACAddress: "0a:58:0a:01:00:07", Role: "secondary", Network: "mig"},
	}
	r, _ := parse([]byte(`{"type":"kvnet-cni","name":"ns_a","netAttachDefName":"ns/a","topology":"layer2","role":"primary","subnets":"10.0.0.0/24"}`))
	a, ok := find(nets, r)
	if !ok || a.Network != "ns_a" {
		t.Fatalf("find by NAD key: %+v %v", a, ok)
	}
	res, err := result("1.1.0", a, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.IPs) != 1 || res.IPs[0].Gateway.String() != "10.0.0.1" || len(res.Routes) != 1 || res.Routes[0].GW.String() != "10.0.0.1" {
		t.Fatalf("result %+v", res)
	}
	r2, _ := parse([]byte(`{"type":"bridge","name":"mig","ipam":{"type":"kvnet-ipam","subnets":"10.1.0.0/16"}}`))
	if a, ok := find(nets, r2); !ok || a.IPAddresses[0] != "10.1.0.7/16" {
		t.Fatalf("find by network name: %+v %v", a, ok)
	}
}
