package lab

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/controlplane"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/node"
	"kvnet.io/kvnet/internal/sim/simkubelet"
	"kvnet.io/kvnet/internal/sim/simnet"
	"kvnet.io/kvnet/internal/sim/simvirt"
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

// KubeletConfig is the simulated kubelet configuration of node nodeName in
// the lab in dir; simkubelet.PodNetNS tells a pod's namespace from it.
func KubeletConfig(dir, nodeName string) simkubelet.Config {
	abs, _ := filepath.Abs(dir)
	prefix := netnsPrefix(dir)
	return simkubelet.Config{
		NodeName:       nodeName,
		NodeNetNS:      prefix + "-" + nodeName,
		CNIBinDir:      filepath.Join(abs, "cni", "bin"),
		CNICacheDir:    filepath.Join(abs, "nodes", nodeName, "cni-cache"),
		PodNetNSPrefix: prefix + "-" + nodeName + "-pod-",
		Env: []string{"KVNET_KUBECONFIG=" + cniKubeconfig(abs, nodeName),
			"KVNET_STATUS_FILE=" + statusFile(abs, nodeName)},
	}
}

// cniKubeconfig is node nodeName's kvnet-cni kubeconfig, which its kvnet-node
// writes from its own service-account credentials, as in the DaemonSet.
func cniKubeconfig(labDir, nodeName string) string {
	return filepath.Join(labDir, "nodes", nodeName, "kvnet-cni.kubeconfig")
}

// statusFile is node nodeName's kvnet-node status file (kvnet-cni reads it
// through $KVNET_STATUS_FILE: the simulated nodes share one filesystem).
func statusFile(labDir, nodeName string) string {
	return filepath.Join(labDir, "nodes", nodeName, "cni-status.json")
}

// startNodes builds n simulated nodes (internal/simnet) and runs on each a
// kvnet-node agent and a simulated kubelet, all in this process. It
// returns once every agent has applied its datapath. stop ends them and
// removes the namespaces.
//
// The agents run as the kvnet-node service account; the simulated kubelet
// and virt-controller, which stand in for components that are not kvnet's,
// are admins.
func startNodes(ctx context.Context, dir string, cp *controlplane.ControlPlane, n int) (stop func(), err error) {
	admin := cp.Config
	agentCfg, err := cp.ServiceAccountConfig(ctx, controlplane.KvnetNamespace, controlplane.NodeServiceAccount, tokenTTL)
	if err != nil {
		return nil, err
	}
	prefix := netnsPrefix(dir)
	if err := simnet.Cleanup(prefix); err != nil {
		return nil, fmt.Errorf("remove a previous lab's namespaces: %w", err)
	}
	names := make([]string, n)
	for i := range names {
		names[i] = NodeName(i + 1)
	}
	sim, err := simnet.New(prefix, names...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stop = func() {
		cancel()
		wg.Wait()
		if err := sim.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "remove lab namespaces:", err)
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	if err := installCNI(dir); err != nil {
		return stop, err
	}
	api, err := url.Parse(admin.Host)
	if err != nil {
		return stop, err
	}
	scheme, err := manager.NewScheme()
	if err != nil {
		return stop, err
	}
	c, err := client.New(admin, client.Options{Scheme: scheme})
	if err != nil {
		return stop, err
	}
	agents := make([]*node.Agent, 0, n)
	errc := make(chan error, 2*n)
	for _, nd := range sim.Nodes {
		if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nd.Name}}); err != nil && !apierrors.IsAlreadyExists(err) {
			return stop, fmt.Errorf("create node %s: %w", nd.Name, err)
		}
		abs, _ := filepath.Abs(dir)
		a, err := node.New(agentCfg, node.Config{
			NodeName:      nd.Name,
			Datapath:      datapath.NodeConfig{NetNS: nd.NS, UnderlayIP: nd.IP, UnderlayDev: simnet.UnderlayDev},
			StatusFile:    statusFile(abs, nd.Name),
			CNIKubeconfig: cniKubeconfig(abs, nd.Name),
		})
		if err != nil {
			return stop, fmt.Errorf("node %s: %w", nd.Name, err)
		}
		agents = append(agents, a)
		wg.Go(func() {
			if err := a.Run(ctx); err != nil {
				errc <- fmt.Errorf("kvnet-node %s: %w", nd.Name, err)
			}
		})
		kc := KubeletConfig(dir, nd.Name)
		kc.RESTConfig = admin
		kc.LoopbackForwards = []string{api.Host}
		kc.Log = ctrl.Log.WithName("simkubelet")
		wg.Go(func() {
			if err := simkubelet.Run(ctx, kc); err != nil {
				errc <- err
			}
		})
	}
	// KubeVirt's part: the KubeVirt CR (registering the l2bridge binding
	// the docs use on primary UDNs) and a virt-controller stand-in.
	if err := installKubeVirtCR(ctx, c); err != nil {
		return stop, err
	}
	wg.Go(func() {
		if err := simvirt.Run(ctx, simvirt.Config{RESTConfig: admin, Nodes: names, Log: ctrl.Log.WithName("simvirt")}); err != nil {
			errc <- fmt.Errorf("simvirt: %w", err)
		}
	})
	deadline := time.After(time.Minute)
	for _, a := range agents {
		for !a.Ready() {
			select {
			case err := <-errc:
				return stop, err
			case <-deadline:
				return stop, errors.New("simulated nodes: kvnet-node not ready after 1m")
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return stop, nil
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

// installCNI links the running binary into the lab's CNI bin dir as
// kvnet-cni and kvnet-ipam: invoked under those names it is the plugin.
func installCNI(dir string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	bin := KubeletConfig(dir, "").CNIBinDir
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	for _, name := range []string{netconf.PluginType, netconf.IPAMType} {
		link := filepath.Join(bin, name)
		_ = os.Remove(link)
		if err := os.Symlink(self, link); err != nil {
			return fmt.Errorf("install %s: %w", name, err)
		}
	}
	return nil
}
