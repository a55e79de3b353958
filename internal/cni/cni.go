// Package cni is kvnet-cni, the CNI 1.1 plugin Multus calls for kvnet
// networks. It allocates nothing: kvnet-controller has already written the
// pod's addresses to the kvnet.io/pod-networks annotation, and ADD waits
// (bounded) for that entry and wires exactly it. The same binary serves
// IPAM-only mode ("ipam": {"type": "kvnet-ipam"} inside a bridge or macvlan
// NAD), returning the allocated addresses as an IPAM result.
//
// It reads the pod through a small PodSource interface, so this package
// imports no Kubernetes client (internal/k8s/podsource implements it).
package cni

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/portalias"
)

// PodSource reads a pod's kvnet.io/pod-networks annotation. It returns nil
// networks (and no error) while the pod has no annotation yet.
type PodSource interface {
	PodNetworks(ctx context.Context, namespace, name string) (podnetworks.Networks, error)
}

// Options are plugin settings a NAD may carry (top level, or inside "ipam"
// in IPAM-only mode).
type Options struct {
	// Kubeconfig of the node's kvnet-cni identity. Default: $KVNET_KUBECONFIG,
	// else /etc/cni/net.d/kvnet.d/kvnet.kubeconfig, else the same under
	// /host (thick Multus; see ThickMultusHostDir).
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// AnnotationTimeout bounds ADD's wait for the allocation ("30s").
	AnnotationTimeout string `json:"annotationTimeout,omitempty"`
	// StatusFile is written by kvnet-node: {"ready": bool,
	// "exhaustedNetworks": [..], "podMTU": n, ...} (see Status). Default: $KVNET_STATUS_FILE,
	// else /run/kvnet/cni-status.json, else the same under /host (thick
	// Multus; see ThickMultusHostDir).
	StatusFile string `json:"statusFile,omitempty"`
	// DefaultMTU when the network sets none (the node's pod MTU).
	DefaultMTU int `json:"defaultMTU,omitempty"`
}

// Defaults.
const (
	DefaultKubeconfig = "/etc/cni/net.d/kvnet.d/kvnet.kubeconfig"
	DefaultStatusFile = "/run/kvnet/cni-status.json"
	defaultTimeout    = 30 * time.Second
	defaultMTU        = 1400
	hostIfPrefix      = "kvp" // host ends of pod veths: "kvp" + 10 hex

	// ThickMultusHostDir is where thick Multus's daemon container (the
	// stock deployments/multus-daemonset-thick.yml) mounts the host's
	// /etc/cni/net.d and /run. The daemon executes delegate plugins such
	// as kvnet-cni itself: chrooted to the host when its "chrootDir" is
	// set (the stock manifest sets it), else inside that container, where
	// kvnet-node's files are found under this directory.
	ThickMultusHostDir = "/host"
)

// hostFile is a file kvnet-node keeps on the node for kvnet-cni.
type hostFile struct {
	what     string // in errors
	env      string // the environment variable that overrides the default
	standard string // the default: the path on the host
}

var (
	// hostRoot is the directory kvnet-node's files are looked up under:
	// "" (the filesystem's root) but in tests.
	hostRoot = ""

	kubeconfigFile = hostFile{what: "kvnet-cni kubeconfig", env: "KVNET_KUBECONFIG", standard: DefaultKubeconfig}
	statusFile     = hostFile{what: "kvnet-node status file", env: "KVNET_STATUS_FILE", standard: DefaultStatusFile}
)

// candidates are the paths to try, in order: an explicit path (the NAD's
// option, else the environment variable) alone, as given; else the path
// on the host, then the same under ThickMultusHostDir.
func (f hostFile) candidates(option string, getenv func(string) string) []string {
	if option != "" {
		return []string{option}
	}
	if env := getenv(f.env); env != "" {
		return []string{env}
	}
	return []string{f.standard, filepath.Join(ThickMultusHostDir, f.standard)}
}

// find returns the first candidate that exists under root (hostRoot),
// joined to root. When none exists, the error names every path tried and
// why it was not used; it wraps each stat error (errors.Is(err,
// fs.ErrNotExist) holds when all were missing).
func (f hostFile) find(root, option string, getenv func(string) string) (string, error) {
	var tried []error
	for _, p := range f.candidates(option, getenv) {
		full := p
		if root != "" {
			full = filepath.Join(root, p)
		}
		_, err := os.Stat(full)
		if err == nil {
			return full, nil
		}
		tried = append(tried, err)
	}
	return "", &notFoundError{what: f.what, tried: tried}
}

// notFoundError is hostFile.find's error: every path tried, with why.
type notFoundError struct {
	what  string
	tried []error
}

func (e *notFoundError) Error() string {
	msgs := make([]string, len(e.tried))
	for i, err := range e.tried {
		msgs[i] = err.Error()
	}
	return "find " + e.what + ": " + strings.Join(msgs, "; ")
}

func (e *notFoundError) Unwrap() []error { return e.tried }

// Plugin implements the CNI verbs.
type Plugin struct {
	// NewSource builds the PodSource from a kubeconfig path.
	NewSource func(kubeconfig string) (PodSource, error)
	// Poll is the interval of ADD's wait (default 100 ms).
	Poll time.Duration
}

// Funcs returns the verbs for skel.PluginMainFuncs.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, GC: p.GC, Status: p.Status}
}

// request is a parsed CNI invocation.
type request struct {
	served   *netconf.Served
	opts     Options
	version  string
	ipamOnly bool
	// attachDefault: kvnet-cni is the pod's default network for Multus
	// (DefaultNetworkArg); see addWithDefault.
	attachDefault bool
	// runtimeConfig is the runtime's (portMappings, ...), passed on to the
	// cluster default network with attachDefault.
	runtimeConfig map[string]any
	// tr traces ADD's phases (nil: not traced).
	tr *tracer
}

func parse(stdin []byte) (*request, error) {
	var top struct {
		CNIVersion string          `json:"cniVersion"`
		Type       string          `json:"type"`
		IPAM       json.RawMessage `json:"ipam"`
		Args       struct {
			CNI map[string]json.RawMessage `json:"cni"`
		} `json:"args"`
		RuntimeConfig map[string]any `json:"runtimeConfig"`
		Options
	}
	if err := json.Unmarshal(stdin, &top); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "decode network configuration", err.Error())
	}
	s, err := netconf.ParseServed(string(stdin))
	if err != nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "invalid network configuration", err.Error())
	}
	if s == nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "invalid network configuration",
			fmt.Sprintf("neither \"type\": %q nor \"ipam\": {\"type\": %q}", netconf.PluginType, netconf.IPAMType))
	}
	r := &request{served: s, opts: top.Options, version: top.CNIVersion, ipamOnly: s.IPAM != nil, runtimeConfig: top.RuntimeConfig}
	if v, ok := top.Args.CNI[DefaultNetworkArg]; ok {
		if err := json.Unmarshal(v, &r.attachDefault); err != nil {
			return nil, types.NewError(types.ErrInvalidNetworkConfig, "invalid network configuration",
				fmt.Sprintf("args.cni[%q] %s: want true or false", DefaultNetworkArg, v))
		}
		if r.attachDefault && (r.ipamOnly || !s.IsPrimary()) {
			return nil, types.NewError(types.ErrInvalidNetworkConfig, "invalid network configuration",
				fmt.Sprintf("args.cni[%q]: network %q is not a primary network; only a primary network can be the pod's default network", DefaultNetworkArg, s.Name))
		}
	}
	if r.ipamOnly && len(top.IPAM) > 0 {
		var o Options
		if err := json.Unmarshal(top.IPAM, &o); err != nil {
			return nil, types.NewError(types.ErrInvalidNetworkConfig, "invalid network configuration", "ipam: "+err.Error())
		}
		r.opts = o
	}
	return r, nil
}

// annotationTimeout is ADD's bound on the wait for the allocation.
func (r *request) annotationTimeout() (time.Duration, error) {
	if r.opts.AnnotationTimeout == "" {
		return defaultTimeout, nil
	}
	timeout, err := time.ParseDuration(r.opts.AnnotationTimeout)
	if err != nil || timeout <= 0 {
		return 0, types.NewError(types.ErrInvalidNetworkConfig, "invalid annotationTimeout", fmt.Sprintf("\"annotationTimeout\" %q is not a positive duration", r.opts.AnnotationTimeout))
	}
	return timeout, nil
}

// podArgs are the Kubernetes CNI_ARGS.
type podArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE types.UnmarshallableString //nolint:revive // CNI_ARGS names
	K8S_POD_NAME      types.UnmarshallableString //nolint:revive
	K8S_POD_UID       types.UnmarshallableString //nolint:revive
}

// podIdentity reads the pod's namespace and name from CNI_ARGS
// ("K=V;K2=V2", as the runtime passes them).
func podIdentity(cniArgs string) (namespace, name string, err error) {
	var pa podArgs
	if err := types.LoadArgs(cniArgs, &pa); err != nil {
		return "", "", types.NewError(types.ErrInvalidEnvironmentVariables, "invalid CNI_ARGS", err.Error())
	}
	namespace, name = string(pa.K8S_POD_NAMESPACE), string(pa.K8S_POD_NAME)
	if namespace == "" || name == "" {
		return "", "", types.NewError(types.ErrInvalidEnvironmentVariables, "missing pod identity", "CNI_ARGS must carry K8S_POD_NAMESPACE and K8S_POD_NAME")
	}
	return namespace, name, nil
}

// HostIfName is the host-side veth name of an attachment (≤ 15 chars,
// stable for a container ID and interface).
func HostIfName(containerID, ifName string) string {
	h := sha256.Sum256([]byte(containerID + "/" + ifName))
	return hostIfPrefix + hex.EncodeToString(h[:])[:10]
}

// entry waits for the pod's allocation for this network.
// load parses the request and finds the attachment kvnet allocated for it.
func (p *Plugin) load(args *skel.CmdArgs) (*request, podnetworks.Attachment, error) {
	r, err := parse(args.StdinData)
	if err != nil {
		return nil, podnetworks.Attachment{}, err
	}
	a, err := p.entry(args, r)
	return r, a, err
}

func (p *Plugin) entry(args *skel.CmdArgs, r *request) (podnetworks.Attachment, error) {
	ns, name, err := podIdentity(args.Args)
	if err != nil {
		return podnetworks.Attachment{}, err
	}
	timeout, err := r.annotationTimeout()
	if err != nil {
		return podnetworks.Attachment{}, err
	}
	if a, err := r.askNode(args, ns, name, timeout); !errors.Is(err, errNodeUnavailable) {
		return a, err
	}
	kubeconfig, err := kubeconfigFile.find(hostRoot, r.opts.Kubeconfig, os.Getenv)
	if err != nil {
		// kvnet-node writes it once it runs on the node.
		return podnetworks.Attachment{}, types.NewError(types.ErrTryAgainLater, "kvnet-cni kubeconfig not found", err.Error())
	}
	src, err := p.NewSource(kubeconfig)
	if err != nil {
		return podnetworks.Attachment{}, types.NewError(types.ErrTryAgainLater, "cannot reach the API server", err.Error())
	}
	r.tr.path("api")
	r.tr.mark("client")
	defer r.tr.mark("lookup")
	poll := p.Poll
	if poll == 0 {
		poll = 100 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var lastErr error
	for {
		nets, err := src.PodNetworks(ctx, ns, name)
		lastErr = err
		if err == nil {
			if a, ok := find(nets, r); ok {
				return a, nil
			}
		}
		select {
		case <-ctx.Done():
			msg := fmt.Sprintf("no allocation for network %q in annotation %s of pod %s/%s after %s; is kvnet-controller running? (pod events say why an allocation failed)",
				r.served.Name, podnetworks.Annotation, ns, name, timeout)
			if lastErr != nil {
				msg += fmt.Sprintf("; last error: %v", lastErr)
			}
			return podnetworks.Attachment{}, types.NewError(types.ErrTryAgainLater, "allocation not found", msg)
		case <-time.After(poll):
		}
	}
}

// find picks the network's entry: by NAD key when the configuration names
// it, else by network name (hand-written and IPAM-only NADs).
func find(nets podnetworks.Networks, r *request) (podnetworks.Attachment, bool) {
	return match(nets, r.nadName(), r.served.Name)
}

// nadName is the NAD key the configuration names, or "".
func (r *request) nadName() string {
	if r.served.Conf != nil {
		return r.served.Conf.NADName
	}
	return ""
}

// askNode asks kvnet-node's socket (next to its status file) for the
// allocation; errNodeUnavailable when nothing answers there.
func (r *request) askNode(args *skel.CmdArgs, ns, name string, timeout time.Duration) (podnetworks.Attachment, error) {
	status, err := r.statusPath()
	if err != nil {
		return podnetworks.Attachment{}, errNodeUnavailable
	}
	var pa podArgs
	_ = types.LoadArgs(args.Args, &pa) // podIdentity has read them
	ctx, cancel := context.WithTimeout(context.Background(), timeout+5*time.Second)
	defer cancel()
	a, err := askNode(ctx, filepath.Join(filepath.Dir(status), SocketName), AttachmentQuery{
		Namespace: ns, Name: name, UID: string(pa.K8S_POD_UID),
		NAD: r.nadName(), Network: r.served.Name, Timeout: timeout,
	})
	if errors.Is(err, errNodeUnavailable) {
		return a, err
	}
	r.tr.path("node")
	r.tr.mark("lookup")
	if errors.Is(err, errNoAllocation) {
		return a, types.NewError(types.ErrTryAgainLater, "allocation not found",
			fmt.Sprintf("no allocation for network %q in annotation %s of pod %s/%s: %v; is kvnet-controller running? (pod events say why an allocation failed)",
				r.served.Name, podnetworks.Annotation, ns, name, err))
	}
	if err != nil {
		return a, types.NewError(types.ErrTryAgainLater, "ask kvnet-node", err.Error())
	}
	return a, nil
}

// result turns an allocation into a CNI result; with iface set, the IPs
// belong to the container interface (index 1).
func result(version string, a podnetworks.Attachment, ifaces []*current.Interface, primary bool) (*current.Result, error) {
	res := &current.Result{CNIVersion: current.ImplementedSpecVersion, Interfaces: ifaces}
	gws := map[bool]net.IP{}
	for _, g := range a.GatewayIPs {
		if addr, err := netip.ParseAddr(g); err == nil {
			gws[addr.Is4()] = net.IP(addr.AsSlice())
		}
	}
	for _, s := range a.IPAddresses {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("annotation %s: ip %q: %w", podnetworks.Annotation, s, err)
		}
		ipc := &current.IPConfig{Address: net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if len(ifaces) > 1 {
			idx := 1
			ipc.Interface = &idx
		}
		if primary {
			ipc.Gateway = gws[p.Addr().Is4()]
		}
		res.IPs = append(res.IPs, ipc)
	}
	for _, rt := range a.Routes {
		_, dst, err := net.ParseCIDR(rt.Dest)
		if err != nil {
			return nil, fmt.Errorf("annotation %s: route %q: %w", podnetworks.Annotation, rt.Dest, err)
		}
		res.Routes = append(res.Routes, &types.Route{Dst: *dst, GW: net.ParseIP(rt.NextHop)})
	}
	if version == "" {
		version = current.ImplementedSpecVersion
	}
	out, err := res.GetAsVersion(version)
	if err != nil {
		return nil, err
	}
	return out.(*current.Result), nil
}

// Add wires the pod (or, in IPAM-only mode, returns its addresses). It
// first collects the default network of sandboxes whose DEL never came
// (collectLostDefaults).
func (p *Plugin) Add(args *skel.CmdArgs) (err error) {
	tr := newTracer()
	r, err := parse(args.StdinData)
	if err != nil {
		return err
	}
	r.tr = tr
	defer func() { tr.write(args.ContainerID, args.IfName, podKey(args), err) }()
	if !r.ipamOnly {
		collectLostDefaults(args, gcBudgetAdd)
		tr.mark("gc")
	}
	a, err := p.entry(args, r)
	if err != nil {
		return err
	}
	if r.ipamOnly {
		res, err := result(r.version, a, nil, false)
		if err != nil {
			return err
		}
		return types.PrintResult(res, r.version)
	}
	if r.attachDefault {
		return p.addWithDefault(args, r, a)
	}
	res, err := wire(args, r, a)
	if err != nil {
		return err
	}
	err = types.PrintResult(res, r.version)
	tr.mark("result")
	return err
}

// wire makes the pod interface args.IfName for allocation a and returns
// its CNI result.
func wire(args *skel.CmdArgs, r *request, a podnetworks.Attachment) (*current.Result, error) {
	mac, err := net.ParseMAC(a.MACAddress)
	if err != nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "bad allocation", err.Error())
	}
	var ips []netip.Prefix
	for _, s := range a.IPAddresses {
		if pfx, err := netip.ParsePrefix(s); err == nil {
			ips = append(ips, pfx)
		}
	}
	var routes []datapath.Route
	for _, rt := range a.Routes {
		dst, err1 := netip.ParsePrefix(rt.Dest)
		via, err2 := netip.ParseAddr(rt.NextHop)
		if err1 == nil && err2 == nil {
			routes = append(routes, datapath.Route{Dst: dst, Via: via})
		}
	}
	mtu := r.served.Conf.MTU
	if mtu == 0 {
		mtu = r.opts.DefaultMTU
	}
	st, stErr := r.status()
	r.tr.mark("status")
	// Refused before anything is made: a pod must not run with an
	// interface nothing connects.
	if stErr == nil {
		if err := unserved(st, r.served.Name); err != nil {
			return nil, err
		}
	}
	localnet := r.served.Conf.Topology == netconf.TopologyLocalnet
	if localnet && (stErr != nil || !st.Ready) {
		// Whether this node can attach it (bridge mapping, VLAN support)
		// is known once kvnet-node has planned; the runtime retries ADD.
		return nil, types.NewError(types.ErrPluginNotAvailable, "kvnet-node not ready",
			fmt.Sprintf("network %q is a localnet network: whether this node can attach it is known once kvnet-node is ready", r.served.Name))
	}
	switch {
	case mtu != 0:
	case localnet:
		mtu = netconf.LocalnetDefaultMTU // as kvnet-node gives its bridge
	case stErr == nil:
		mtu = st.PodMTU
	}
	if mtu == 0 {
		mtu = defaultMTU
	}
	host := HostIfName(args.ContainerID, args.IfName)
	ok := false
	defer func() {
		if !ok {
			_ = datapath.TeardownPodInterface(host)
		}
	}()
	// A primary network takes the default route from the cluster default
	// network's eth0: read eth0's gateways first, for the probes' path.
	primaryBesideEth0 := r.served.IsPrimary() && args.IfName != datapath.DefaultNetworkIfName
	var eth0Gateways datapath.Gateways
	if primaryBesideEth0 {
		gws, err := datapath.DefaultGateways(args.Netns, datapath.DefaultNetworkIfName)
		if err != nil {
			return nil, types.NewError(types.ErrInternal, "read the cluster default network's routes", err.Error())
		}
		eth0Gateways = gws
		r.tr.mark("gateways")
	}
	if err := datapath.SetupPodInterface(args.Netns, args.IfName, host, mac, ips, routes, mtu); err != nil {
		return nil, types.NewError(types.ErrInternal, "set up pod interface", err.Error())
	}
	r.tr.mark("veth")
	if primaryBesideEth0 {
		if _, err := datapath.KeepProbePath(args.Netns, datapath.DefaultNetworkIfName, eth0Gateways); err != nil {
			return nil, types.NewError(types.ErrInternal, "keep the kubelet's probes on the cluster default network", err.Error())
		}
		r.tr.mark("probepath")
	}
	if primaryBesideEth0 && restrictsDefaultNetwork(st, stErr) {
		if err := restrictDefaultNetwork(args.Netns); err != nil {
			return nil, types.NewError(types.ErrInternal, "restrict the cluster default network interface", err.Error())
		}
		r.tr.mark("restrict")
	}
	// kvnet-node attaches the host end to the network's bridge (it knows
	// the network ID and owns the bridge); the alias tells it which pod and
	// network the port is, since the name only encodes the container.
	if err := setAlias(host, portalias.Format(podKey(args), nadKeyOf(r, a))); err != nil {
		return nil, types.NewError(types.ErrInternal, "label host interface", err.Error())
	}
	r.tr.mark("alias")
	res, err := result(r.version, a, []*current.Interface{
		{Name: host},
		{Name: args.IfName, Mac: mac.String(), Sandbox: args.Netns},
	}, r.served.IsPrimary())
	if err != nil {
		return nil, err
	}
	ok = true
	return res, nil
}

// Del removes the host end (the pod end goes with it). It succeeds when
// everything is already gone, including the netns. Then it collects the
// default network of sandboxes whose DEL never came (collectLostDefaults).
func (p *Plugin) Del(args *skel.CmdArgs) error {
	r, err := parse(args.StdinData)
	if err != nil {
		return err
	}
	if r.ipamOnly {
		return nil // addresses are freed by kvnet-controller when the pod goes
	}
	defer collectLostDefaults(args, gcBudgetDel)
	if r.attachDefault || addedWithDefault(args, r) {
		return delWithDefault(args, r)
	}
	if err := datapath.TeardownPodInterface(HostIfName(args.ContainerID, args.IfName)); err != nil {
		return types.NewError(types.ErrInternal, "tear down pod interface", err.Error())
	}
	return nil
}

// Check verifies that the pod interface has the allocated MAC, addresses
// and routes.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	r, a, err := p.load(args)
	if err != nil {
		return err
	}
	if r.ipamOnly {
		return nil
	}
	if r.attachDefault {
		return checkWithDefault(args, r, a)
	}
	return checkInterface(args.Netns, args.IfName, a)
}

// GC removes host ends of pod veths that belong to no valid attachment.
func (p *Plugin) GC(args *skel.CmdArgs) error {
	keep, err := gcKeep(args.StdinData)
	if err != nil {
		return err
	}
	return gcHostInterfaces(hostIfPrefix, keep)
}

// gcKeep reads GC's stdin and returns the host ends of its valid
// attachments ("cni.dev/valid-attachments"), which GC must keep.
func gcKeep(stdin []byte) (map[string]bool, error) {
	var in struct {
		Valid []types.GCAttachment `json:"cni.dev/valid-attachments"`
	}
	if err := json.Unmarshal(stdin, &in); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "decode GC arguments", err.Error())
	}
	keep := map[string]bool{}
	for i, a := range in.Valid {
		if a.ContainerID == "" || a.IfName == "" {
			return nil, types.NewError(types.ErrInvalidNetworkConfig, "invalid GC arguments",
				fmt.Sprintf("\"cni.dev/valid-attachments\"[%d]: \"containerID\" %q and \"ifname\" %q must both be set", i, a.ContainerID, a.IfName))
		}
		keep[HostIfName(a.ContainerID, a.IfName)] = true
	}
	return keep, nil
}

// Status is what kvnet-node writes to the status file for the STATUS verb.
type Status struct {
	Ready             bool     `json:"ready"`
	ExhaustedNetworks []string `json:"exhaustedNetworks"`
	// UnservedNetworks maps each network kvnet-node cannot attach on this
	// node (a localnet network without a bridge mapping, or with a VLAN
	// the kernel cannot tag) to why; ADD and STATUS refuse them with it.
	UnservedNetworks map[string]string `json:"unservedNetworks,omitempty"`
	// PodMTU is the node's pod MTU (underlay minus VXLAN overhead, or
	// kvnet-node's --mtu): ADD uses it for networks that set no MTU, so
	// pods, bridges and DHCP option 26 agree.
	PodMTU int `json:"podMTU,omitempty"`
	// AllowDefaultNetwork (kvnet-node --allow-default-network) leaves the
	// cluster default network interface (eth0) of primary-UDN pods open;
	// by default ADD restricts it to the node (kubelet probes) and replies.
	AllowDefaultNetwork bool `json:"allowDefaultNetwork,omitempty"`
}

// statusPath finds the status file of a request (see statusFile).
func (r *request) statusPath() (string, error) {
	return statusFile.find(hostRoot, r.opts.StatusFile, os.Getenv)
}

// status finds and reads the status file of a request.
func (r *request) status() (Status, error) {
	path, err := r.statusPath()
	if err != nil {
		return Status{}, err
	}
	return readStatus(path)
}

// readStatus reads kvnet-node's status file.
func readStatus(path string) (Status, error) {
	var st Status
	b, err := os.ReadFile(path)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%s: %w", path, err)
	}
	return st, nil
}

// Status reports whether pods can be added to this network now: code 50
// ("plugin not available") when kvnet-node is not ready or the network's
// address pool is exhausted.
func (p *Plugin) Status(args *skel.CmdArgs) error {
	r, err := parse(args.StdinData)
	if err != nil {
		return err
	}
	path, err := r.statusPath()
	if err != nil {
		return types.NewError(types.ErrPluginNotAvailable, "kvnet-node not ready", err.Error())
	}
	st, err := readStatus(path)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
		return types.NewError(types.ErrPluginNotAvailable, "kvnet-node not ready", fmt.Sprintf("read %s: %v", path, err))
	}
	if err != nil {
		return types.NewError(types.ErrPluginNotAvailable, "kvnet-node status unreadable", err.Error())
	}
	if !st.Ready {
		return types.NewError(types.ErrPluginNotAvailable, "kvnet-node not ready", path+" says not ready")
	}
	for _, n := range st.ExhaustedNetworks {
		if n == r.served.Name {
			return types.NewError(types.ErrPluginNotAvailable, "address pool exhausted", fmt.Sprintf("network %q has no free address", n))
		}
	}
	return unserved(st, r.served.Name)
}

// unserved returns the error for a network kvnet-node says it cannot
// attach on this node, or nil.
func unserved(st Status, network string) error {
	if why, ok := st.UnservedNetworks[network]; ok {
		return types.NewError(types.ErrPluginNotAvailable, "network cannot be attached on this node", fmt.Sprintf("network %q: %s", network, why))
	}
	return nil
}

func podKey(args *skel.CmdArgs) string {
	ns, name, _ := podIdentity(args.Args)
	return ns + "/" + name
}

func nadKeyOf(r *request, a podnetworks.Attachment) string {
	if r.served.Conf != nil && r.served.Conf.NADName != "" {
		return r.served.Conf.NADName
	}
	return a.Network
}

// restrictsDefaultNetwork reports whether ADD restricts a primary-UDN
// pod's cluster default network interface, given kvnet-node's status and
// the error reading it: unless kvnet-node says --allow-default-network.
// An unreadable status file restricts: the safe default.
func restrictsDefaultNetwork(st Status, stErr error) bool {
	return stErr != nil || !st.AllowDefaultNetwork
}

// restrictDefaultNetwork keeps the pod's cluster-default-network interface
// (eth0, attached by Multus before the primary network) for the kubelet:
// only the node's addresses and replies get in. A pod without eth0 (the
// primary network attached the OVN-Kubernetes way) has nothing to
// restrict.
func restrictDefaultNetwork(netnsPath string) error {
	addrs, err := datapath.HostAddresses()
	if err != nil {
		return err
	}
	err = datapath.RestrictDefaultNetwork(netnsPath, datapath.DefaultNetworkIfName, addrs)
	if errors.Is(err, datapath.ErrNoDefaultInterface) {
		return nil
	}
	return err
}
