package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/template"
)

// nodeDirs are the directories each node has of its own, bind-mounted
// from <node dir>/root in its mount namespace (/run is a fresh tmpfs).
var nodeDirs = []string{
	"/var/lib/kubelet",
	"/var/lib/containerd",
	"/var/lib/cni",
	"/var/log/pods",
	"/var/log/containers",
	"/etc/cni",
	"/opt/cni/bin",
}

// cniPlugins are copied into every node's /opt/cni/bin from the bin dir:
// the reference plugins a node has from its CNI package (Flannel
// delegates to bridge and host-local, and chains portmap; the ptp32
// layout runs ptp; KubeVirt's migration network in the VM scenarios is a
// macvlan NAD).
var cniPlugins = []string{"bridge", "host-local", "loopback", "macvlan", "portmap", "ptp"}

// node is one node's files.
type node struct {
	i      int
	dir    string // <cluster dir>/nodes/node-i
	binDir string // kubelet and the CNI plugins
	dual   bool   // a dual-stack cluster's node
}

// nodeIPs is the kubelet's --node-ip: the node's address, or both.
func (n node) nodeIPs() string {
	if n.dual {
		return NodeIP(n.i).String() + "," + NodeIP6(n.i).String()
	}
	return NodeIP(n.i).String()
}

// clusterCIDRs is kube-proxy's clusterCIDR: the pod ranges.
func (n node) clusterCIDRs() string {
	if n.dual {
		return ClusterCIDR.String() + "," + ClusterCIDR6.String()
	}
	return ClusterCIDR.String()
}

func (n node) name() string         { return NodeName(n.i) }
func (n node) root(p string) string { return filepath.Join(n.dir, "root", p) }
func (n node) path(p string) string { return filepath.Join(n.dir, p) }

// cgroupRoot is the node's kubelet --cgroup-root: its pods' cgroups live
// under it in every hierarchy.
func (n node) cgroupRoot() string { return "/" + cgroupPrefix + n.name() }

// write lays out the node's directories and configuration files: the
// kubelet's kubeconfig and kube-proxy's.
func (n node) write(kubeconfig, proxyKubeconfig []byte, sandboxImage, registry string) error {
	for _, d := range nodeDirs {
		if err := os.MkdirAll(n.root(d), 0o755); err != nil {
			return err
		}
	}
	for _, d := range []string{"logs", "certs.d/" + registry} {
		if err := os.MkdirAll(n.path(d), 0o755); err != nil {
			return err
		}
	}
	for _, p := range cniPlugins {
		b, err := os.ReadFile(filepath.Join(n.binDir, p))
		if err != nil {
			return fmt.Errorf("CNI plugin %s: %w (run hack/build-cluster-tools.sh)", p, err)
		}
		if err := os.WriteFile(n.root("/opt/cni/bin/"+p), b, 0o755); err != nil { //nolint:gosec // an executable
			return err
		}
	}
	files := map[string]string{
		"kubeconfig":            string(kubeconfig),
		"kube-proxy.kubeconfig": string(proxyKubeconfig),
		"kube-proxy.yaml": render(kubeProxyConfig, map[string]any{
			"Kubeconfig": n.path("kube-proxy.kubeconfig"), "Name": n.name(), "ClusterCIDR": n.clusterCIDRs(),
		}),
		"containerd.toml":                     render(containerdConfig, map[string]any{"SandboxImage": sandboxImage, "CertsDir": n.path("certs.d")}),
		"certs.d/" + registry + "/hosts.toml": render(registryHosts, map[string]any{"Registry": registry}),
		"kubelet.yaml": render(kubeletConfig, map[string]any{
			"CgroupRoot": n.cgroupRoot(), "NodeIP": NodeIP(n.i).String(), "ResolvConf": n.path("resolv.conf"),
		}),
		// Pods with dnsPolicy Default get this; the cluster DNS (CoreDNS)
		// is set in kubelet.yaml for ClusterFirst.
		"resolv.conf": "nameserver " + HostIP.String() + "\noptions ndots:1\n",
		"init.sh":     render(initScript, map[string]any{"Dir": n.dir, "Dirs": nodeDirs, "Name": n.name(), "NodeIP": n.nodeIPs(), "BinDir": n.binDir}),
	}
	for name, content := range files {
		mode := os.FileMode(0o644)
		if name == "init.sh" {
			mode = 0o755
		}
		if err := os.WriteFile(n.path(name), []byte(content), mode); err != nil {
			return err
		}
	}
	return nil
}

// writeCNI writes the node's default network: the reference bridge plugin
// with host-local IPAM on its pod subnet. containerd picks it up from
// /etc/cni/net.d and the node turns Ready.
func (n node) writeCNI() error {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "kvnet-lab",
		"plugins": []any{map[string]any{
			"type":        "bridge",
			"bridge":      "cni0",
			"isGateway":   true,
			"ipMasq":      false, // pods see each other's addresses: no NAT
			"hairpinMode": true,
			"ipam": map[string]any{
				"type":   "host-local",
				"ranges": [][]map[string]string{{{"subnet": PodCIDR(n.i).String()}}},
				"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
			},
		}},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	return n.writeConflist(b)
}

func render(t *template.Template, data any) string {
	var b bytes.Buffer
	if err := t.Execute(&b, data); err != nil {
		panic(err) // the templates are ours
	}
	return b.String()
}

var funcs = template.FuncMap{"join": strings.Join}

// containerdConfig is containerd 1.6's configuration (version 2 format).
var containerdConfig = template.Must(template.New("containerd").Parse(`# containerd of one kvnet-lab cluster node (internal/lab/cluster).
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
# Snapshotters and plugins this host has no use for.
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  # The pod sandbox image comes from the cluster's registry.
  sandbox_image = "{{.SandboxImage}}"
  # This host withholds CAP_SYS_RESOURCE, so nothing may lower its
  # oom_score_adj below containerd's own: the kubelet's -998 for pod
  # sandboxes fails in runc ("failed to update /proc/self/oom_score_adj:
  # Permission denied"). Clamp to containerd's value instead.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # cgroupfs, as the kubelet: PID 1 is not systemd here.
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    # hosts.toml per registry: the cluster's registry speaks plain HTTP.
    config_path = "{{.CertsDir}}"
`))

var registryHosts = template.Must(template.New("hosts").Parse(`# The kvnet-lab cluster's registry, plain HTTP on the host bridge.
server = "http://{{.Registry}}"

[host."http://{{.Registry}}"]
  capabilities = ["pull", "resolve"]
`))

// kubeletConfig: docs/cluster.md explains each setting.
var kubeletConfig = template.Must(template.New("kubelet").Parse(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: {{.CgroupRoot}}
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
address: {{.NodeIP}}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
clusterDomain: cluster.local
clusterDNS:
- 10.96.0.10
resolvConf: {{.ResolvConf}}
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
protectKernelDefaults: false
serializeImagePulls: false
nodeStatusReportFrequency: 10s
oomScoreAdj: 0
`))

// kubeProxyConfig: kube-proxy in nftables mode, in the node's network
// namespace (docs/cluster.md says why a process and not a DaemonSet).
var kubeProxyConfig = template.Must(template.New("kube-proxy").Parse(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: {{.Kubeconfig}}
hostnameOverride: {{.Name}}
# Traffic from outside the pod network to a Service is masqueraded.
clusterCIDR: {{.ClusterCIDR}}
detectLocalMode: ClusterCIDR
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  # nf_conntrack_max is the host's, not the node's to change (and
  # read-only in a network namespace): 0 leaves it as it is.
  maxPerCore: 0
  min: 0
`))

// initScript is the node's PID 1 (sh, in its own network, mount and PID
// namespaces): it lays the node's mounts, starts containerd, the kubelet
// and kube-proxy, and reaps orphans until it is killed.
var initScript = template.Must(template.New("init").Funcs(funcs).Parse(`#!/bin/sh
# PID 1 of kvnet-lab cluster node {{.Name}} (internal/lab/cluster).
set -eu
N={{.Dir}}
# Mounts made here stay in the node: shared among its own mounts (the
# kubelet's mount propagation), private to the host (unshare made a copy).
mount -t tmpfs -o mode=0755 tmpfs /run
for d in {{join .Dirs " "}}; do
  mount --bind "$N/root$d" "$d"
done
mount --make-rshared /
echo {{.Name}} > "$N/hostname"
containerd --config "$N/containerd.toml" >"$N/logs/containerd.log" 2>&1 &
i=0
while [ ! -S /run/containerd/containerd.sock ]; do
  i=$((i + 1))
  if [ $i -gt 300 ]; then echo "containerd did not start: see $N/logs/containerd.log" >&2; exit 1; fi
  sleep 0.1
done
{{.BinDir}}/kubelet --config="$N/kubelet.yaml" --kubeconfig="$N/kubeconfig" \
  --hostname-override={{.Name}} --node-ip={{.NodeIP}} --v=1 >"$N/logs/kubelet.log" 2>&1 &
{{.BinDir}}/kube-proxy --config="$N/kube-proxy.yaml" --v=1 >"$N/logs/kube-proxy.log" 2>&1 &
# Reap every child, orphans of containerd's shims included, until killed.
while true; do wait || true; sleep 1; done
`))
