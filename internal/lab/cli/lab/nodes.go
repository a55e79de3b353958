package lab

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/lab/controlplane"
	"kvnet.io/kvnet/internal/lab/guest"
	"kvnet.io/kvnet/internal/lab/simcluster"
	"kvnet.io/kvnet/internal/lab/simkubelet"
	"kvnet.io/kvnet/internal/lab/simlauncher"
	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/node"
	"kvnet.io/kvnet/internal/repo"
)

// NodeName is the name of simulated node i (1-based).
func NodeName(i int) string { return fmt.Sprintf("node-%d", i) }

// netnsPrefix names every network namespace of the lab in dir: a hash of
// the directory, so two labs (or a lab and the tests) never collide, and
// a crashed lab's namespaces are found again by the next one.
func netnsPrefix(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = dir
	}
	sum := sha256.Sum256([]byte(abs))
	return "kvlab" + hex.EncodeToString(sum[:3])
}

// clusterConfig is the simulated cluster of the lab in dir: nodes named
// node-1..node-n (simnet and Kubernetes names alike), its files under dir.
func clusterConfig(dir string, n int) simcluster.Config {
	abs, _ := filepath.Abs(dir)
	names := make([]string, n)
	for i := range names {
		names[i] = NodeName(i + 1)
	}
	return simcluster.Config{
		Prefix:    netnsPrefix(dir),
		Nodes:     names,
		NodeName:  func(n string) string { return n },
		StateDir:  abs,
		CNIBinDir: filepath.Join(abs, "cni", "bin"),
	}
}

// NodeNetNS is the network namespace (its path) of simulated node
// nodeName of the lab in dir.
func NodeNetNS(dir, nodeName string) string {
	return nl.NSPath(netnsPrefix(dir) + "-" + nodeName)
}

// KubeletConfig is the simulated kubelet configuration of node nodeName in
// the lab in dir; simkubelet.PodNetNS tells a pod's namespace from it.
func KubeletConfig(dir, nodeName string) simkubelet.Config {
	return clusterConfig(dir, 0).KubeletConfig(nodeName)
}

// shippedBinary is the kvnet binary name installed next to the running
// kvnet (make build puts them all into bin/).
func shippedBinary(name string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(self), name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s not found next to %s: build all binaries into one directory (make build)", name, self)
	}
	return p, nil
}

// startNodes builds n simulated nodes and runs on each the shipped
// kvnet-node binary and a simulated kubelet, plus the virt-controller
// stand-in (internal/lab/simcluster). It returns once every kvnet-node has
// applied its datapath; the cluster's Failed channel reports a component
// that stops later.
//
// kvnet-node runs as the kvnet-node service account and installs kvnet-cni
// as the DaemonSet does; the simulated kubelet and virt-controller, which
// stand in for components that are not kvnet's, are admins.
//
// Without guests, no QEMU runs: a launcher pod is its network namespace.
//
// With multus, the kubelets behave like stock Multus over a stand-in
// cluster default network (simcluster.Config.MultusDefaultNetwork).
//
// With guests and guestAgent, the VMIs' status.interfaces report the
// addresses the guests hold, from their console leases, as KubeVirt's do
// from the guest agent (simvirt.Config.GuestAgent); otherwise what kvnet
// allocated to their launcher pods.
func startNodes(ctx context.Context, dir string, cp *controlplane.ControlPlane, c client.Client, n int, guests, guestAgent, multus bool) (*simcluster.Cluster, *simlauncher.Launcher, error) {
	return startNodesWith(ctx, dir, cp, c, n, guests, guestAgent, multus, nil)
}

// startNodesWith is startNodes with the simulated cluster's configuration
// changed by adjust (when not nil) before it starts.
func startNodesWith(ctx context.Context, dir string, cp *controlplane.ControlPlane, c client.Client, n int, guests, guestAgent, multus bool, adjust func(*simcluster.Config)) (*simcluster.Cluster, *simlauncher.Launcher, error) {
	nodeBin, err := shippedBinary("kvnet-node")
	if err != nil {
		return nil, nil, err
	}
	cniBin, err := shippedBinary("kvnet-cni")
	if err != nil {
		return nil, nil, err
	}
	agentCfg, err := cp.ServiceAccountConfig(ctx, controlplane.KvnetNamespace, controlplane.NodeServiceAccount, tokenTTL)
	if err != nil {
		return nil, nil, err
	}
	cfg := clusterConfig(dir, n)
	// Tools find the lab's namespaces by this prefix.
	if err := os.WriteFile(filepath.Join(cfg.StateDir, "netns-prefix"), []byte(cfg.Prefix+"\n"), 0o644); err != nil {
		return nil, nil, err
	}
	cfg.AgentKubeconfig = filepath.Join(cfg.StateDir, "kvnet-node.kubeconfig")
	if _, err := node.WriteCNIKubeconfig(cfg.AgentKubeconfig, agentCfg); err != nil {
		return nil, nil, err
	}
	api, err := url.Parse(cp.Config.Host)
	if err != nil {
		return nil, nil, err
	}
	cfg.Admin, cfg.APIAddr = cp.Config, api.Host
	cfg.AgentBinary, cfg.CNIBinary = nodeBin, cniBin
	// Reference CNI plugins built next to kvnet (make build), for NADs
	// such as a macvlan migration network with kvnet-ipam.
	for _, name := range []string{"macvlan", "bridge", "host-local"} {
		p, err := shippedBinary(name)
		if err == nil {
			cfg.ExtraCNIPlugins = append(cfg.ExtraCNIPlugins, p)
		} else if multus && name != "macvlan" {
			return nil, nil, fmt.Errorf("the stand-in cluster default network needs the %s CNI plugin: %w", name, err)
		}
	}
	cfg.MultusDefaultNetwork = multus
	cfg.Kubelets, cfg.Virt = true, true
	cfg.Log = ctrl.Log
	// KubeVirt's part: the KubeVirt CR (registering the l2bridge binding
	// the docs use on primary UDNs); simcluster runs the virt-controller
	// stand-in, and the launcher stand-in runs a QEMU guest per running
	// VMI in its launcher pod.
	if err := installKubeVirtCR(ctx, c); err != nil {
		return nil, nil, err
	}
	var launcher *simlauncher.Launcher
	if guests {
		l, err := newLauncher(ctx, dir, cp)
		if err != nil {
			return nil, nil, err
		}
		launcher, cfg.Runtime = l, l
		if guestAgent {
			cfg.GuestAgent = l
		}
	}
	if adjust != nil {
		adjust(&cfg)
	}
	cl, err := simcluster.Start(ctx, cfg)
	if err != nil {
		if launcher != nil {
			launcher.Close()
		}
		return nil, nil, err
	}
	return cl, launcher, nil
}

// VMsDir is where the lab in dir keeps its guests' console logs
// (<namespace>_<vmi>.log) and QEMU sockets.
func VMsDir(dir string) string { return filepath.Join(dir, "vms") }

// newLauncher checks QEMU, builds the guest image when it is missing or
// stale (hack/guest/build.sh: Debian's cloud kernel and busybox-static,
// downloaded with apt-get, about a minute the first time) and returns the
// virt-launcher stand-in.
func newLauncher(ctx context.Context, dir string, cp *controlplane.ControlPlane) (*simlauncher.Launcher, error) {
	if err := guest.CheckQEMU(); err != nil {
		return nil, fmt.Errorf("the lab runs VMs as QEMU guests: %w", err)
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, errors.New("nft not found: install the Debian package nftables (hack/install-deps.sh does); the lab's masquerade binding writes KubeVirt's NAT rules in the launcher pod with it")
	}
	root, err := repo.Root()
	if err != nil {
		return nil, fmt.Errorf("guest image: %w", err)
	}
	start := time.Now()
	img, err := guest.EnsureImageContext(ctx, root)
	if err != nil {
		return nil, err
	}
	fmt.Printf("guest image %s ready in %s\n", filepath.Dir(img.Kernel), time.Since(start).Round(time.Millisecond))
	abs, _ := filepath.Abs(dir)
	return simlauncher.New(simlauncher.Config{
		RESTConfig: cp.Config, Image: img, StateDir: VMsDir(abs),
		PodNetNS: func(p *corev1.Pod) (string, error) {
			return simkubelet.PodNetNS(KubeletConfig(abs, p.Spec.NodeName), p), nil
		},
		Log: ctrl.Log.WithName("virt-launcher"),
	})
}

// installKubeVirtCR creates kubevirt/kubevirt, as installing KubeVirt
// does, with the l2bridge binding registered.
func installKubeVirtCR(ctx context.Context, c client.Client) error {
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kubevirt"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	kv := &kubevirtv1.KubeVirt{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kubevirt", Name: "kubevirt"},
		Spec: kubevirtv1.KubeVirtSpec{Configuration: kubevirtv1.KubeVirtConfiguration{NetworkConfiguration: &kubevirtv1.NetworkConfiguration{
			Binding: map[string]kubevirtv1.InterfaceBindingPlugin{"l2bridge": {DomainAttachmentType: "managedTap"}},
		}}},
	}
	if err := c.Create(ctx, kv); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create the KubeVirt CR: %w", err)
	}
	return nil
}
