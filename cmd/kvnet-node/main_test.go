package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"kvnet.io/kvnet/internal/install"
	"kvnet.io/kvnet/internal/node"
)

// runMainEnv, set in a test binary's environment, makes it run kvnet-node's
// main without arguments instead of the tests.
const runMainEnv = "KVNET_NODE_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		os.Args = []string{"kvnet-node"}
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestClusterSettingsFromEnv: every key of the ConfigMap kvnet-node-config
// reaches kvnet-node's flag of that name through its environment variable
// (the real main, run with a value each flag refuses: the error names the
// variable or the flag, and the value, and kvnet-node exits 2 before it
// touches anything).
func TestClusterSettingsFromEnv(t *testing.T) {
	cases := map[string]struct{ value, want string }{
		"cluster-dns-service":   {"kube-dns", `--cluster-dns-service "kube-dns"`},
		"cluster-domain":        {"not a domain", `--cluster-domain "not a domain"`},
		"service-cidrs":         {"10.96.0.0/33", `--service-cidrs "10.96.0.0/33"`},
		"default-network-cidrs": {"calico", `--default-network-cidrs "calico"`},
		"vxlan-port":            {"vx", `$KVNET_VXLAN_PORT (ConfigMap kvnet-node-config, key vxlan-port) "vx": parse error`},
		"dns-proxy-port":        {"70000", `--dns-proxy-port 70000`},
		"pod-scope":             {"some", `--pod-scope "some": want "cluster" or "networks"`},
		"allow-default-network": {"maybe", `$KVNET_ALLOW_DEFAULT_NETWORK (ConfigMap kvnet-node-config, key allow-default-network) "maybe": parse error`},
	}
	for _, name := range clusterSettings {
		tc, ok := cases[name]
		if !ok {
			t.Errorf("no case for setting %s", name)
			continue
		}
		// Should a setting not stop it, no kubeconfig ends it too (exit 1).
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), runMainEnv+"=1", "NODE_NAME=n1", "KUBECONFIG=/nonexistent", "KUBERNETES_SERVICE_HOST=",
			settingEnv(name)+"="+tc.value)
		out, err := cmd.CombinedOutput()
		cancel()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), tc.want) {
			t.Errorf("%s=%q: %v, output:\n%s\nwant exit 2 saying %s", settingEnv(name), tc.value, err, out, tc.want)
		}
	}
}

// TestSettingsFromEnv: a setting given on the command line wins over its
// variable; an empty variable keeps the default.
func TestSettingsFromEnv(t *testing.T) {
	fs := flag.NewFlagSet("kvnet-node", flag.ContinueOnError)
	dns := fs.String("cluster-dns-service", "kube-system/kube-dns", "")
	domain := fs.String("cluster-domain", "cluster.local", "")
	for _, n := range clusterSettings[2:] {
		fs.String(n, "", "")
	}
	if err := fs.Parse([]string{"--cluster-domain=example.org"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"KVNET_CLUSTER_DOMAIN": "from.env", "KVNET_CLUSTER_DNS_SERVICE": "", "KVNET_SERVICE_CIDRS": "10.96.0.0/12"}
	if err := settingsFromEnv(fs, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if *domain != "example.org" || *dns != "kube-system/kube-dns" || fs.Lookup("service-cidrs").Value.String() != "10.96.0.0/12" {
		t.Errorf("cluster-domain %q, cluster-dns-service %q, service-cidrs %q; want the command line's, the default, the variable's",
			*domain, *dns, fs.Lookup("service-cidrs").Value)
	}
}

// TestClusterSettingsManifest: config/node's ConfigMap kvnet-node-config
// has exactly the keys kvnet-node reads, and its DaemonSet passes each as
// its variable.
func TestClusterSettingsManifest(t *testing.T) {
	objs, err := install.RenderObjects(install.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var keys, passed []string
	for _, u := range objs {
		switch {
		case u.GetKind() == "ConfigMap" && u.GetName() == "kvnet-node-config":
			data, _, _ := unstructured.NestedStringMap(u.Object, "data")
			for k := range data {
				keys = append(keys, k)
			}
			if u.GetAnnotations()[install.InstallAnnotation] != install.CreateOnly {
				t.Errorf("kvnet-node-config is not create-only: an upgrade would reset it")
			}
		case u.GetKind() == "DaemonSet" && u.GetName() == "kvnet-node":
			containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
			for _, ct := range containers {
				env, _ := ct.(map[string]any)["env"].([]any)
				for _, e := range env {
					e := e.(map[string]any)
					cm, _, _ := unstructured.NestedString(e, "valueFrom", "configMapKeyRef", "name")
					key, _, _ := unstructured.NestedString(e, "valueFrom", "configMapKeyRef", "key")
					if cm == "kvnet-node-config" {
						passed = append(passed, key)
						if e["name"] != settingEnv(key) {
							t.Errorf("key %s passed as %v, want %s", key, e["name"], settingEnv(key))
						}
					}
				}
			}
		}
	}
	want := slices.Sorted(slices.Values(clusterSettings))
	slices.Sort(keys)
	slices.Sort(passed)
	if !slices.Equal(keys, want) || !slices.Equal(passed, want) {
		t.Errorf("ConfigMap keys %v, DaemonSet passes %v; want kvnet-node's settings %v", keys, passed, want)
	}
}

// TestConfigureClusterDNS: --cluster-dns-service and --cluster-domain are
// taken when valid, and refused with the flag and value named otherwise.
func TestConfigureClusterDNS(t *testing.T) {
	for _, tt := range []struct {
		svc, domain, want string
	}{
		{"openshift-dns/dns-default", "cluster.local", ""},
		{"kube-dns", "cluster.local", `--cluster-dns-service "kube-dns": want namespace/name`},
		{"kube-system/", "cluster.local", `--cluster-dns-service "kube-system/": want namespace/name`},
		{"kube-system/a/b", "cluster.local", `want namespace/name`},
		{"Kube_System/kube-dns", "cluster.local", `--cluster-dns-service "Kube_System/kube-dns": namespace:`},
		{"kube-system/kube-dns", "not a domain", `--cluster-domain "not a domain"`},
	} {
		cfg := node.Config{ClusterDomain: tt.domain}
		cfg.Datapath.NetNS = "lab" // no underlay lookup
		err := configure(&cfg, flagValues{dns: "192.0.2.53", clusterDNS: tt.svc})
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%q %q: %v", tt.svc, tt.domain, err)
		case tt.want == "" && cfg.ClusterDNS.String() != tt.svc:
			t.Errorf("%q: cluster DNS %s", tt.svc, cfg.ClusterDNS)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%q %q: %v, want an error containing %q", tt.svc, tt.domain, err, tt.want)
		}
	}
}

// TestConfigureCIDRs: --service-cidrs and --default-network-cidrs are
// parsed (masked), and a bad entry is refused with the flag and value
// named.
func TestConfigureCIDRs(t *testing.T) {
	for _, tc := range []struct {
		f                  flagValues
		services, defaults string
		err                string
	}{
		{f: flagValues{serviceCIDRs: "10.96.0.1/12, fd00:96::/108"}, services: "[10.96.0.0/12 fd00:96::/108]", defaults: "[]"},
		{f: flagValues{defaultNetworkCIDRs: "192.168.0.0/16,fd00:10:244::1/56"}, services: "[]", defaults: "[192.168.0.0/16 fd00:10:244::/56]"},
		{f: flagValues{serviceCIDRs: "10.96.0.0/12,10.300.0.0/16"}, err: `--service-cidrs "10.300.0.0/16"`},
		{f: flagValues{defaultNetworkCIDRs: "192.168.0.0/16,calico"}, err: `--default-network-cidrs "calico"`},
		{f: flagValues{defaultNetworkCIDRs: "192.168.0.0/16,"}, err: `--default-network-cidrs ""`},
	} {
		cfg := node.Config{ClusterDomain: "cluster.local"}
		cfg.Datapath.NetNS = "lab"
		tc.f.dns, tc.f.clusterDNS = "192.0.2.53", "kube-system/kube-dns"
		err := configure(&cfg, tc.f)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%+v: %v, want an error naming %s", tc.f, err, tc.err)
			}
		case err != nil:
			t.Errorf("%+v: %v", tc.f, err)
		case fmt.Sprint(cfg.ServiceCIDRs) != tc.services || fmt.Sprint(cfg.DefaultNetworkCIDRs) != tc.defaults:
			t.Errorf("%+v: service CIDRs %v, default network CIDRs %v; want %s, %s", tc.f, cfg.ServiceCIDRs, cfg.DefaultNetworkCIDRs, tc.services, tc.defaults)
		}
	}
}
