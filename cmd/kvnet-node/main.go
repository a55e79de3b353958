// Command kvnet-node is the node agent: it programs the node's kvnet
// datapath (bridges, VXLAN, routers, nftables) and DHCP from the API.
package main

import (
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/dhcp"
	"kvnet.io/kvnet/internal/k8s/apiwait"
	"kvnet.io/kvnet/internal/node"
	"kvnet.io/kvnet/internal/reserved"
)

func main() {
	var cfg node.Config
	flag.StringVar(&cfg.NodeName, "node-name", os.Getenv("NODE_NAME"), "name of this node (default $NODE_NAME)")
	flag.StringVar(&cfg.Datapath.UnderlayDev, "underlay-interface", "", "interface carrying the overlay and egress (default: the one holding --underlay-ip, else the default route's)")
	underlayIP := flag.String("underlay-ip", os.Getenv("NODE_IP"), "VTEP address of this node (default $NODE_IP, else the first address of --underlay-interface)")
	flag.StringVar(&cfg.Datapath.RouterNSPrefix, "router-netns-prefix", "", "prefix of the names (under /run/netns) of the tenant router namespaces kvnet-node creates (default \"kvnet-r\"); "+
		"set it when several kvnet-nodes share one /run/netns, as the lab's simulated nodes do")
	flag.IntVar(&cfg.Datapath.MTU, "mtu", 0, "pod MTU (default: the underlay MTU minus the VXLAN overhead)")
	flag.IntVar(&cfg.Datapath.VXLANPort, "vxlan-port", datapath.DefaultVXLANPort,
		"UDP port of kvnet's VXLAN tunnels, the same on every node: change it where the cluster default network's VXLAN uses 4789 (Calico); Flannel and Cilium use 8472")
	dns := flag.String("dns", "", "comma-separated DNS servers handed out by DHCP where the cluster DNS Service does not exist (default: the nameservers of /etc/resolv.conf)")
	clusterDNS := flag.String("cluster-dns-service", node.DefaultClusterDNS.String(),
		"namespace/name of the cluster DNS Service: pods on primary user-defined networks reach it, and DHCP hands its cluster IP to VMs there")
	serviceCIDRs := flag.String("service-cidrs", "", "comma-separated Service ranges of the cluster beyond its ServiceCIDR objects (needed before Kubernetes 1.33): "+
		"pods on primary user-defined networks reach no Service there but their own, the cluster DNS and the API server")
	defaultNetworkCIDRs := flag.String("default-network-cidrs", "", "comma-separated pod ranges of the cluster default network beyond the Nodes' spec.podCIDRs "+
		"(where its IPAM has pools of its own, as Calico's): pods on primary user-defined networks reach no pod there")
	dnsProxyPort := flag.Uint("dns-proxy-port", uint(node.DefaultDNSProxyPort), "port of the DNS proxy at each primary network's transit address on the node, through which its pods reach the cluster DNS "+
		"(it rewrites their default-network addresses in answers, e.g. of headless Services, to their addresses on the network); 0 disables it")
	flag.StringVar(&cfg.ClusterDomain, "cluster-domain", node.DefaultClusterDomain, "the cluster's DNS domain, for the search list DHCP hands to VMs")
	flag.BoolVar(&cfg.AllowDefaultNetwork, "allow-default-network", false,
		"leave the cluster default network interface (eth0) of pods on a primary user-defined network open to every pod; "+
			"by default only the node (kubelet probes) and replies to the pod's own connections get in")
	flag.StringVar(&cfg.PodScope, "pod-scope", node.PodScopeCluster,
		"which pods kvnet-node watches: \"cluster\", every pod of the cluster; \"networks\", this node's and those of the networks it serves, found by their network.kvnet.io/ label "+
			"(its memory, plan time and API traffic then grow with its networks, not with the cluster; kvnet-controller labels every pod it allocates, older ones when it starts)")
	flag.StringVar(&cfg.StatusFile, "status-file", "", "status file read by kvnet-cni STATUS (default /run/kvnet/cni-status.json)")
	flag.DurationVar(&cfg.Resync, "resync", time.Minute, "re-apply the datapath this often even without changes")
	flag.StringVar(&cfg.MetricsAddr, "metrics-bind-address", ":9464", "address of the Prometheus metrics endpoint; 0 disables it")
	flag.StringVar(&cfg.ProbeAddr, "health-probe-bind-address", ":9465", "address of /healthz and /readyz; 0 disables them")
	flag.StringVar(&cfg.CNIKubeconfig, "cni-kubeconfig", "", "keep a kubeconfig for kvnet-cni here (e.g. /host/etc/cni/net.d/kvnet.d/kvnet.kubeconfig); empty: don't")
	cniBinDir := flag.String("cni-bin-dir", "", "install kvnet-cni (and kvnet-ipam) into this directory at start; empty: don't")
	cniSource := flag.String("cni-binary", "", "the kvnet-cni binary to install (default: kvnet-cni next to this executable)")
	cleanup := flag.Bool("cleanup", false, "remove everything kvnet made on this node (links, pod veths, router namespaces, nftables tables, kvnet-cni and its files), log what was removed, and exit; "+
		"kvnet uninstall runs it on every node (the kvnet-node-cleanup DaemonSet). Only --router-netns-prefix, --cni-bin-dir and --host-root apply")
	hostRoot := flag.String("host-root", "/", "with --cleanup: where the node's root file system is mounted (its /run/kvnet, /etc/cni/net.d/kvnet.d and /var/lib/cni/kvnet are removed)")
	idle := flag.Bool("idle", false, "do nothing until terminated: the kvnet-node-cleanup DaemonSet's main container, Ready once its --cleanup init container succeeded")
	reservedSubnets := reserved.Flags(flag.CommandLine)
	// Millisecond timestamps: a live migration's switch-over is read from
	// logs in milliseconds (--zap-time-encoding overrides it).
	zapOpts := zap.Options{TimeEncoder: zapcore.RFC3339NanoTimeEncoder}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	if err := settingsFromEnv(flag.CommandLine, os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "kvnet-node:", err)
		os.Exit(2)
	}

	switch {
	case *cleanup:
		os.Exit(runCleanup(cfg.NodeName, cfg.Datapath.RouterNSPrefix, *hostRoot, *cniBinDir))
	case *idle:
		<-ctrl.SetupSignalHandler().Done()
		return
	}
	if err := configure(&cfg, flagValues{underlayIP: *underlayIP, dns: *dns, clusterDNS: *clusterDNS,
		serviceCIDRs: *serviceCIDRs, defaultNetworkCIDRs: *defaultNetworkCIDRs, dnsProxyPort: *dnsProxyPort}); err != nil {
		fmt.Fprintln(os.Stderr, "kvnet-node:", err)
		os.Exit(2)
	}
	r, err := reservedSubnets()
	if err == nil {
		err = datapath.SetMasqueradeSubnets(r.Masquerade[0], r.Masquerade[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvnet-node:", err)
		os.Exit(2)
	}
	cfg.Reserved = r
	if *cniBinDir != "" {
		src := *cniSource
		if src == "" {
			self, err := os.Executable()
			if err != nil {
				fmt.Fprintln(os.Stderr, "kvnet-node:", err)
				os.Exit(1)
			}
			src = filepath.Join(filepath.Dir(self), "kvnet-cni")
		}
		if err := node.InstallCNI(src, *cniBinDir); err != nil {
			fmt.Fprintln(os.Stderr, "kvnet-node:", err)
			os.Exit(1)
		}
	}
	ctx, restCfg := ctrl.SetupSignalHandler(), ctrl.GetConfigOrDie()
	// The agent's manager needs the API's discovery data: wait for the
	// API server rather than exit into the kubelet's back-off.
	err = apiwait.Wait(ctx, restCfg, apiwait.DefaultBackoff, ctrl.Log.WithName("kvnet-node"))
	var agent *node.Agent
	if err == nil {
		agent, err = node.New(restCfg, cfg)
	}
	if err == nil {
		err = agent.Run(ctx)
	}
	if err != nil {
		ctrl.Log.Error(err, "kvnet-node failed")
		os.Exit(1)
	}
}

// flagValues are the flags configure parses.
type flagValues struct {
	underlayIP, dns, clusterDNS       string
	serviceCIDRs, defaultNetworkCIDRs string
	dnsProxyPort                      uint
}

// configure fills the underlay, DNS and cluster range settings from the
// flags.
func configure(cfg *node.Config, f flagValues) error {
	var err error
	if cfg.ServiceCIDRs, err = parsePrefixes("--service-cidrs", f.serviceCIDRs); err != nil {
		return err
	}
	if cfg.DefaultNetworkCIDRs, err = parsePrefixes("--default-network-cidrs", f.defaultNetworkCIDRs); err != nil {
		return err
	}
	ns, name, ok := strings.Cut(f.clusterDNS, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return fmt.Errorf("--cluster-dns-service %q: want namespace/name", f.clusterDNS)
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return fmt.Errorf("--cluster-dns-service %q: namespace: %s", f.clusterDNS, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1035Label(name); len(errs) > 0 {
		return fmt.Errorf("--cluster-dns-service %q: name: %s", f.clusterDNS, strings.Join(errs, "; "))
	}
	cfg.ClusterDNS = types.NamespacedName{Namespace: ns, Name: name}
	if f.dnsProxyPort > 65535 {
		return fmt.Errorf("--dns-proxy-port %d: want a port (1-65535), or 0 to disable the DNS proxy", f.dnsProxyPort)
	}
	cfg.DNSProxyPort = uint16(f.dnsProxyPort)
	if errs := validation.IsDNS1123Subdomain(cfg.ClusterDomain); len(errs) > 0 {
		return fmt.Errorf("--cluster-domain %q: %s", cfg.ClusterDomain, strings.Join(errs, "; "))
	}
	if err := node.CheckPodScope(cfg.PodScope); err != nil {
		return fmt.Errorf("--%w", err)
	}
	if f.underlayIP != "" {
		ip, err := netip.ParseAddr(f.underlayIP)
		if err != nil {
			return fmt.Errorf("--underlay-ip %q: %v", f.underlayIP, err)
		}
		cfg.Datapath.UnderlayIP = ip
	}
	if p := cfg.Datapath.RouterNSPrefix; strings.ContainsAny(p, "/ ") || len(p) > 200 {
		return fmt.Errorf("--router-netns-prefix %q: a namespace name prefix has no '/' or space and at most 200 characters", p)
	}
	if cfg.Datapath.UnderlayDev == "" || !cfg.Datapath.UnderlayIP.IsValid() {
		if err := findUnderlay(cfg); err != nil {
			return err
		}
	}
	if f.dns != "" {
		for _, s := range strings.Split(f.dns, ",") {
			ip, err := netip.ParseAddr(strings.TrimSpace(s))
			if err != nil {
				return fmt.Errorf("--dns %q: %v", s, err)
			}
			cfg.DNS = append(cfg.DNS, ip)
		}
	} else if servers, err := dhcp.DefaultDNS("/etc/resolv.conf"); err == nil {
		cfg.DNS = servers
	}
	return nil
}

// findUnderlay picks the interface holding the underlay IP, or the first
// interface with a global unicast address if none is given.
func findUnderlay(cfg *node.Config) error {
	ifaces, err := net.Interfaces()
	if err != nil {
		return err
	}
	for _, ifc := range ifaces {
		if cfg.Datapath.UnderlayDev != "" && ifc.Name != cfg.Datapath.UnderlayDev {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			pfx, err := netip.ParsePrefix(a.String())
			if err != nil || !pfx.Addr().IsGlobalUnicast() {
				continue
			}
			if cfg.Datapath.UnderlayIP.IsValid() && pfx.Addr() != cfg.Datapath.UnderlayIP {
				continue
			}
			cfg.Datapath.UnderlayDev, cfg.Datapath.UnderlayIP = ifc.Name, pfx.Addr()
			return nil
		}
	}
	return fmt.Errorf("no interface holds underlay IP %q (--underlay-ip / --underlay-interface)", cfg.Datapath.UnderlayIP)
}

// runCleanup removes kvnet's state from this node (node.Cleanup), logs
// each thing removed, and returns the exit code.
func runCleanup(nodeName, routerNSPrefix, hostRoot, cniBinDir string) int {
	logger := ctrl.Log.WithName("kvnet-node-cleanup")
	if strings.ContainsAny(routerNSPrefix, "/ ") || len(routerNSPrefix) > 200 {
		fmt.Fprintf(os.Stderr, "kvnet-node: --router-netns-prefix %q: a namespace name prefix has no '/' or space and at most 200 characters\n", routerNSPrefix)
		return 2
	}
	if !filepath.IsAbs(hostRoot) {
		fmt.Fprintf(os.Stderr, "kvnet-node: --host-root %q: want an absolute path\n", hostRoot)
		return 2
	}
	if cniBinDir == "" {
		cniBinDir = filepath.Join(hostRoot, "opt/cni/bin")
	}
	cfg := node.CleanupConfig{Datapath: datapath.NodeConfig{Name: nodeName, RouterNSPrefix: routerNSPrefix}, HostRoot: hostRoot, CNIBinDir: cniBinDir}
	removed, err := node.Cleanup(cfg)
	for _, r := range removed {
		logger.Info("removed", "what", r)
	}
	if err != nil {
		logger.Error(err, "clean up node")
		return 1
	}
	logger.Info("node clean", "removed", len(removed))
	return 0
}

// parsePrefixes parses the comma-separated prefixes of flag name (masked);
// an empty value is none.
func parsePrefixes(name, value string) ([]netip.Prefix, error) {
	if value == "" {
		return nil, nil
	}
	var out []netip.Prefix
	for _, s := range strings.Split(value, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("%s %q: %v", name, s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// clusterSettings are the flags the ConfigMap kvnet-node-config sets, one
// key each (config/node/config.yaml): the DaemonSet passes key k as the
// environment variable settingEnv(k).
var clusterSettings = []string{"cluster-dns-service", "cluster-domain", "service-cidrs", "default-network-cidrs", "vxlan-port", "allow-default-network", "dns-proxy-port", "pod-scope"}

// settingEnv returns the environment variable of flag name:
// KVNET_DEFAULT_NETWORK_CIDRS for default-network-cidrs.
func settingEnv(name string) string {
	return "KVNET_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// settingsFromEnv sets each of clusterSettings not given on the command
// line from its environment variable, when that is not empty; a value the
// flag refuses is an error naming the variable, the ConfigMap key and the
// value.
func settingsFromEnv(fs *flag.FlagSet, getenv func(string) string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, name := range clusterSettings {
		v := getenv(settingEnv(name))
		if v == "" || given[name] {
			continue
		}
		if err := fs.Set(name, v); err != nil {
			return fmt.Errorf("$%s (ConfigMap kvnet-node-config, key %s) %q: %v", settingEnv(name), name, v, err)
		}
	}
	return nil
}
