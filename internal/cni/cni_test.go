package cni

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"kvnet.io/kvnet/internal/netconf"
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
		{"ipam option of the wrong type", `{"type":"bridge","name":"m","ipam":{"type":"kvnet-ipam","subnets":"10.0.0.0/24","annotationTimeout":5}}`, "annotationTimeout"},
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

func TestPodIdentity(t *testing.T) {
	ns, name, err := podIdentity("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=abc")
	if err != nil || ns != "ns1" || name != "p" {
		t.Fatalf("got %q %q %v", ns, name, err)
	}
	for args, want := range map[string]string{
		"K8S_POD_NAMESPACE=ns1":                                  "missing pod identity",
		"K8S_POD_NAMESPACE=ns1;K8S_POD_NAME":                     `invalid pair "K8S_POD_NAME"`,
		"K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=p;OTHER=x":           `unknown args ["OTHER=x"]`,
		"IgnoreUnknown=maybe;K8S_POD_NAMESPACE=a;K8S_POD_NAME=b": "invalid input maybe",
	} {
		if _, _, err := podIdentity(args); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("podIdentity(%q) = %v, want %q", args, err, want)
		}
	}
}

func TestAnnotationTimeout(t *testing.T) {
	for opt, want := range map[string]time.Duration{"": defaultTimeout, "5s": 5 * time.Second} {
		r := &request{opts: Options{AnnotationTimeout: opt}}
		if got, err := r.annotationTimeout(); err != nil || got != want {
			t.Errorf("%q: %v, %v; want %v", opt, got, err, want)
		}
	}
	for _, opt := range []string{"soon", "-1s", "0s"} {
		r := &request{opts: Options{AnnotationTimeout: opt}}
		if _, err := r.annotationTimeout(); err == nil || !strings.Contains(err.Error(), `"annotationTimeout" "`+opt+`"`) {
			t.Errorf("%q: err = %v", opt, err)
		}
	}
}

func TestGCKeep(t *testing.T) {
	keep, err := gcKeep([]byte(`{"cniVersion":"1.1.0","name":"n","type":"kvnet-cni","cni.dev/valid-attachments":[{"containerID":"c1","ifname":"net1"}]}`))
	if err != nil || len(keep) != 1 || !keep[HostIfName("c1", "net1")] {
		t.Fatalf("keep %v, %v", keep, err)
	}
	if _, err := gcKeep([]byte(`{"cni.dev/valid-attachments":[{"containerID":"c1"}]}`)); err == nil || !strings.Contains(err.Error(), `"ifname" ""`) {
		t.Fatalf("attachment without ifname: %v", err)
	}
}

// TestRestrictsDefaultNetwork: the status file's allowDefaultNetwork
// (kvnet-node --allow-default-network) turns the eth0 restriction off;
// without it, or without a readable status, ADD restricts.
func TestRestrictsDefaultNetwork(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		name, content string // content "": no file
		restricts     bool
	}{
		{"opted out", `{"ready":true,"exhaustedNetworks":[],"allowDefaultNetwork":true}`, false},
		{"default", `{"ready":true,"exhaustedNetworks":[]}`, true},
		{"explicitly not opted out", `{"ready":true,"allowDefaultNetwork":false}`, true},
		{"unreadable", `{"ready":true,"allowDefaultNetwork":"yes"}`, true},
		{"missing", "", true},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-")+".json")
		if tt.content != "" {
			write(t, path, tt.content)
		}
		r := &request{opts: Options{StatusFile: path}}
		st, err := r.status()
		if got := restrictsDefaultNetwork(st, err); got != tt.restricts {
			t.Errorf("%s: restricts %v (status %+v, %v), want %v", tt.name, got, st, err, tt.restricts)
		}
	}
}

// cniError asserts that err is a CNI error (what skel prints to the
// runtime) with a code and a message.
func cniError(t *testing.T, err error) {
	t.Helper()
	var e *types.Error
	if !errors.As(err, &e) || e.Code == 0 || e.Msg == "" {
		t.Fatalf("not a CNI error with code and message: %#v", err)
	}
}

// FuzzParse feeds the plugin's stdin parser with network configurations as
// the runtime sends them (runtimeConfig, prevResult and args included).
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"cniVersion":"1.1.0","type":"kvnet-cni","name":"ns_a","netAttachDefName":"ns/a","topology":"layer2","role":"primary","subnets":"10.0.0.0/24,fd00::/64","mtu":1400,"annotationTimeout":"10s","defaultMTU":1450}`,
		`{"cniVersion":"1.0.0","type":"kvnet-cni","name":"n","topology":"layer3","subnets":"10.0.0.0/16/24","runtimeConfig":{"mac":"0a:58:0a:00:00:05"},"args":{"cni":{"ips":["10.0.0.5"]}}}`,
		`{"cniVersion":"1.1.0","type":"kvnet-cni","name":"n","topology":"localnet","vlanID":7,"prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"kvp0"}],"ips":[{"address":"10.0.0.5/24","interface":0}]}}`,
		`{"cniVersion":"1.0.0","type":"bridge","name":"mig","bridge":"br-mig","ipam":{"type":"kvnet-ipam","subnets":"10.200.0.0/24","gatewayIPs":"10.200.0.1","annotationTimeout":"5s","statusFile":"/tmp/s.json"}}`,
		`{"cniVersion":"1.0.0","name":"mv","plugins":[{"type":"macvlan","ipam":{"type":"kvnet-ipam","subnets":"fd00::/64"}}]}`,
		`{"type":"bridge","name":"mig","ipam":{"type":"kvnet-ipam","subnets":"10.0.0.0/24","annotationTimeout":5}}`,
		`{"type":"kvnet-cni","name":"n","topology":"layer2","annotationTimeout":"-1s"}`,
		`{"type":"kvnet-cni","name":"n","topology":"mesh"}`,
		`{"type":"kvnet-cni","name":"n","topology":"layer2","mtu":"big"}`,
		`{"type":"bridge","name":"b","ipam":{"type":"host-local"}}`,
		`{`, `null`, `[]`, `""`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, stdin []byte) {
		r, err := parse(stdin)
		if err != nil {
			if r != nil {
				t.Fatalf("request %+v with error %v", r, err)
			}
			cniError(t, err)
			return
		}
		if r.served == nil || r.served.Name == "" {
			t.Fatalf("request without a named network: %+v", r)
		}
		if r.ipamOnly != (r.served.IPAM != nil) || r.ipamOnly == (r.served.Conf != nil) {
			t.Fatalf("ipamOnly %v for served %+v", r.ipamOnly, r.served)
		}
		// The plugin serves exactly what the allocator serves.
		s, err := netconf.ParseServed(string(stdin))
		if err != nil || s == nil || s.Name != r.served.Name {
			t.Fatalf("allocator reads %+v, %v; plugin read %+v", s, err, r.served)
		}
		if d, err := r.annotationTimeout(); err != nil {
			cniError(t, err)
			if !strings.Contains(err.Error(), `"annotationTimeout"`) {
				t.Fatalf("error does not name the field: %v", err)
			}
		} else if d <= 0 {
			t.Fatalf("annotationTimeout %v", d)
		}
		noEnv := func(string) string { return "" }
		if p := statusFile.candidates(r.opts.StatusFile, noEnv); len(p) == 0 || p[0] == "" ||
			(r.opts.StatusFile != "" && (len(p) != 1 || p[0] != r.opts.StatusFile)) {
			t.Fatalf("status file candidates %q for option %q", p, r.opts.StatusFile)
		}
	})
}

// FuzzPodIdentity feeds CNI_ARGS.
func FuzzPodIdentity(f *testing.F) {
	for _, s := range []string{
		"IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=virt-launcher-vm1-abcde;K8S_POD_INFRA_CONTAINER_ID=0123;K8S_POD_UID=u",
		"K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=p",
		"K8S_POD_NAMESPACE=ns1", "K8S_POD_NAME==", "IgnoreUnknown=2", "CommonArgs=x", ";;", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, args string) {
		ns, name, err := podIdentity(args)
		if err != nil {
			cniError(t, err)
			return
		}
		if ns == "" || name == "" || strings.ContainsAny(ns+name, ";=") {
			t.Fatalf("identity %q/%q from %q", ns, name, args)
		}
		// What the runtime would pass for this pod reads back the same.
		ns2, name2, err := podIdentity("K8S_POD_NAMESPACE=" + ns + ";K8S_POD_NAME=" + name)
		if err != nil || ns2 != ns || name2 != name {
			t.Fatalf("round trip of %q/%q: %q/%q, %v", ns, name, ns2, name2, err)
		}
	})
}

// FuzzGCKeep feeds GC's stdin.
func FuzzGCKeep(f *testing.F) {
	for _, s := range []string{
		`{"cniVersion":"1.1.0","name":"n","type":"kvnet-cni","cni.dev/valid-attachments":[{"containerID":"c1","ifname":"net1"},{"containerID":"c2","ifname":"eth0"}]}`,
		`{"cniVersion":"1.1.0","name":"n","type":"kvnet-cni"}`,
		`{"cni.dev/valid-attachments":[{"containerID":"c1"}]}`,
		`{"cni.dev/valid-attachments":{}}`, `{`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, stdin []byte) {
		keep, err := gcKeep(stdin)
		if err != nil {
			cniError(t, err)
			return
		}
		for name := range keep {
			if len(name) > 15 || !strings.HasPrefix(name, hostIfPrefix) {
				t.Fatalf("kept host interface %q is not one of ours", name)
			}
		}
	})
}
