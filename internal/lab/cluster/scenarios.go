package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// The pod scenarios (RunPodScenarios): what a user of kvnet on a real
// cluster expects of pods on user-defined networks, each checked through
// the Kubernetes API alone (objects, and exec into the pods).
const (
	// ScenarioPrimaryReady: pods of a namespace with a primary Layer2
	// UDN, on two nodes, with HTTP readiness and TCP liveness probes,
	// become Ready with an ovn-udn1 address of the network.
	ScenarioPrimaryReady = "primary-udn-pods-ready"
	// ScenarioPrimaryReach: each reaches the other at its ovn-udn1
	// address.
	ScenarioPrimaryReach = "primary-udn-reach"
	// ScenarioEth0Isolated: eth0 holds the default network's address (the
	// pod IP) and leads to no other pod, either way.
	ScenarioEth0Isolated = "primary-udn-eth0-isolated"
	// ScenarioTenantIsolation: a second namespace with its own primary
	// Layer2 UDN on the same subnet reaches neither of the first's pods,
	// nor they it.
	ScenarioTenantIsolation = "tenant-isolation"
	// ScenarioServiceDNS: a ClusterIP Service of the UDN's pods answers
	// at its name (CoreDNS) from a pod of the UDN, from each of its two
	// backends.
	ScenarioServiceDNS = "udn-service-by-name"
	// ScenarioServiceAffinity: a Service with sessionAffinity ClientIP
	// over the same two backends answers every connection of one client
	// from one backend, where Service web (the control) answers from
	// both.
	ScenarioServiceAffinity = "udn-service-affinity"
	// ScenarioNodePortLocal: NodePort Service web-local
	// (externalTrafficPolicy Local) over the same backends is answered,
	// from this host, at a-1's node by a-1 only and at a-2's by a-2 only;
	// a node with neither drops the connection, where Service web-np
	// (policy Cluster, the control) answers there from both.
	ScenarioNodePortLocal = "udn-nodeport-local"
	// ScenarioLoadBalancer: LoadBalancer Services web-lb (policy
	// Cluster) and web-lb-local (policy Local) over the same backends,
	// their status.loadBalancer.ingress set as a load balancer's
	// controller sets it and routed by this host to one node as a load
	// balancer delivers it: web-lb's address is answered by both backends
	// through the node with neither; web-lb-local's by a-1 only through
	// a-1's node and not at all through the node with neither; and the
	// Service's healthCheckNodePort says so at every node (200 with one
	// local endpoint where a backend runs, 503 elsewhere).
	ScenarioLoadBalancer = "udn-loadbalancer"
	// ScenarioServiceOtherTenant: a pod of tenant B reaches none of
	// tenant A's Service web by its cluster IP, node ports (at its own
	// node's address and another's) or load balancer address, each
	// after a positive control: a-1 reaches the cluster IP, this host
	// the node ports and the load balancer address, and b-1 its own
	// network's b-2.
	ScenarioServiceOtherTenant = "udn-service-other-tenant"
	// ScenarioHeadless: headless Service web-hl over a-1 and a-2 (also
	// their subdomain) resolves, through CoreDNS, to their UDN addresses
	// from a pod of the UDN, where a default-network pod (the control)
	// and tenant B's pod get the default-network addresses CoreDNS
	// answers; a-2's hostname.subdomain name resolves and answers too.
	ScenarioHeadless = "udn-headless-dns"
	// ScenarioPolicy: NetworkPolicy on a primary UDN through real
	// kubelets and CoreDNS: a default-deny policy stops pol-1's
	// connections to pol-2 and its DNS, while both stay Ready (kubelet
	// probes go over eth0); allowing egress to the cluster DNS Service's
	// cluster IP, as docs/policy.md says, brings names back and nothing
	// else; a policy pair admitting pol-1 to pol-2's http port opens that
	// one way only.
	ScenarioPolicy = "udn-policy-default-deny"
	// ScenarioMatrix: the upstream NetworkPolicy model on a primary
	// CUDN over namespaces x, y and z (pods a, b, c each, on two nodes,
	// ports 80 and 81): for each case (no policy, the control; default
	// deny ingress and egress; namespace, namespace-and-pod, port, named
	// port and egress rules) every pair on both ports is admitted or
	// refused as the model says.
	ScenarioMatrix = "udn-policy-matrix"
	// ScenarioEgress: a pod of the UDN reaches HTTP servers outside the
	// cluster through its network's router, not through eth0: its node
	// translated the router's transit address, where a default-network
	// pod's connection (the control) is translated from its pod IP.
	ScenarioEgress = "udn-egress"
	// ScenarioSecondary: two pods on two nodes attached to a secondary
	// Layer2 UDN reach each other on it.
	ScenarioSecondary = "secondary-udn-reach"
	// ScenarioMultiPolicy: a MultiNetworkPolicy for the secondary UDN
	// (k8s.v1.cni.cncf.io/policy-for) denying ingress stops sec-1 and
	// sec-2 from reaching each other over net1; a second one admitting
	// sec-1 to sec-2's http port opens that one way only.
	ScenarioMultiPolicy = "secondary-udn-multi-policy"
	// ScenarioCUDN: pods of two namespaces a primary Layer2
	// ClusterUserDefinedNetwork selects reach each other over it.
	ScenarioCUDN = "cudn-reach"
	// ScenarioLayer3: pods of a primary Layer3 UDN on two nodes reach
	// each other.
	ScenarioLayer3 = "layer3-reach"
	// ScenarioLocalnet: pods of a namespace a Localnet
	// ClusterUserDefinedNetwork selects, on two nodes whose bridge
	// mappings name the datacenter network's bridge, get addresses of
	// its subnet from kvnet's IPAM, reach each other over it and reach a
	// host of the datacenter (this host), which sees their own addresses.
	ScenarioLocalnet = "localnet-reach"
)

// PodScenarios are the scenarios' names in the order RunPodScenarios
// reports them: one result each.
var PodScenarios = []string{
	ScenarioPrimaryReady, ScenarioPrimaryReach, ScenarioEth0Isolated, ScenarioTenantIsolation,
	ScenarioServiceDNS, ScenarioServiceAffinity, ScenarioNodePortLocal, ScenarioLoadBalancer, ScenarioServiceOtherTenant,
	ScenarioHeadless, ScenarioPolicy, ScenarioMatrix, ScenarioEgress, ScenarioSecondary, ScenarioMultiPolicy, ScenarioCUDN, ScenarioLayer3, ScenarioLocalnet,
}

// ScenarioLabel marks every namespace and ClusterUserDefinedNetwork the
// scenarios create; CleanupPodScenarios deletes what carries it.
const ScenarioLabel = "lab.kvnet.io/scenarios"

// The scenarios' namespaces, networks and subnets.
const (
	nsTenantA    = "scn-tenant-a" // primary Layer2 UDN "net", pods a-1, a-2, Service web
	nsTenantB    = "scn-tenant-b" // primary Layer2 UDN "net" on the same subnet, pods b-1, b-2
	nsPlain      = "scn-plain"    // the cluster default network only: pods plain-1, plain-2
	nsSecondary  = "scn-secondary"
	nsRed        = "scn-red" // red and blue share the CUDN scn-shared
	nsBlue       = "scn-blue"
	nsLayer3     = "scn-layer3"
	nsPolicy     = "scn-policy"   // primary Layer2 UDN "net", pods pol-1, pol-2, Service web
	nsLocalnet   = "scn-localnet" // the Localnet CUDN scn-datacenter: pods loc-1, loc-2
	localnetName = "scn-datacenter"
	cudnName     = "scn-shared"
)

var (
	tenantSubnet    = netip.MustParsePrefix("10.0.0.0/24")
	tenantBReserved = netip.MustParsePrefix("10.0.0.0/25") // tenant B allocates from .128: no address both tenants hold
	secondarySubnet = netip.MustParsePrefix("192.168.100.0/24")
	cudnSubnet      = netip.MustParsePrefix("10.203.0.0/16")
	layer3Subnet    = netip.MustParsePrefix("10.128.0.0/16")
	policySubnet    = netip.MustParsePrefix("10.204.0.0/24")
)

var (
	udnGVR  = schema.GroupVersionResource{Group: "k8s.ovn.org", Version: "v1", Resource: "userdefinednetworks"}
	cudnGVR = schema.GroupVersionResource{Group: "k8s.ovn.org", Version: "v1", Resource: "clusteruserdefinednetworks"}
	nadGVR  = schema.GroupVersionResource{Group: "k8s.cni.cncf.io", Version: "v1", Resource: "network-attachment-definitions"}
)

// Annotations of Multus and kvnet's webhook.
const (
	networksAnnotation      = "k8s.v1.cni.cncf.io/networks"
	networkStatusAnnotation = "k8s.v1.cni.cncf.io/network-status"
	primaryLabel            = "k8s.ovn.org/primary-user-defined-network"
	primaryInterface        = "ovn-udn1"
)

// ScenarioTarget is the cluster the scenarios run against, reached
// through its API only.
type ScenarioTarget struct {
	// Config and Client reach the API server as an admin.
	Config *rest.Config
	Client kubernetes.Interface
	// Image is the workload image: busybox with sh, httpd, ip and
	// httpget (the lab's kvnet-lab/busybox).
	Image string
	// Nodes are the two nodes every pair of pods is spread over (empty:
	// the first two Ready nodes by name).
	Nodes []string
	// EgressURL is an HTTP URL outside the cluster that a pod of a
	// primary UDN must reach (2xx), e.g. the registry's http://<host>:5000/v2/.
	EgressURL string
	// EgressListen is an address of this host, outside the cluster and
	// reachable from its pods, where the egress scenario serves the
	// egress server (egress.go) on a free port: it answers with the
	// client's address as it sees it and what the client's node
	// translated to it.
	EgressListen netip.Addr
	// NodeNetns returns the path of a node's network namespace on this
	// host, whose conntrack table the egress server reads (needs root).
	NodeNetns func(node string) (string, error)
	// PodTimeout bounds the wait for the pods to be Ready (0: 4 minutes).
	PodTimeout time.Duration
	// GuestImage is the lab guest's containerDisk (GUEST_IMAGE of the
	// env file), for RunVMScenarios; empty without KubeVirt.
	GuestImage string
	// Datacenter is this host's address on the datacenter network
	// (PhysSubnet), which every node reaches through its bridge
	// PhysNodeBridge; the localnet scenario maps PhysNetwork to that
	// bridge on every node. Zero: there is none, and the localnet
	// scenario fails saying so.
	Datacenter netip.Addr
	// DualStack says the cluster is dual-stack (Config.IPFamily
	// IPFamilyDual): RunPodScenarios adds ScenarioDualStack.
	DualStack bool
	// MigrationMaster is the nodes' uplink the VM scenarios' migration
	// network (macvlan) sits on (empty: eth0, the lab nodes').
	MigrationMaster string
	// Skip names pod scenarios RunPodScenarios does not run (and has no
	// result for); skipping ScenarioMatrix also leaves its nine pods
	// uncreated. For a cluster that differs from another only where
	// those scenarios cannot tell (the real-cluster variants).
	Skip []string
}

// ScenarioTarget returns the target of the scenarios on this cluster:
// its admin client, the busybox image, its first two nodes and the
// registry as the outside server.
func (c *Cluster) ScenarioTarget() ScenarioTarget {
	t := ScenarioTarget{Config: c.CP.Config, Client: c.Client, Image: c.Images["busybox"], EgressURL: "http://" + c.Registry + "/v2/", GuestImage: c.Images["guest"],
		EgressListen: HostIP, NodeNetns: nodeNetnsPath, Datacenter: PhysHostIP, DualStack: c.IPFamily == IPFamilyDual}
	if len(c.Nodes) >= 2 {
		t.Nodes = c.Nodes[:2]
	}
	return t
}

// ScenarioTargetFromDir returns the target of the scenarios on the
// cluster whose state directory (kvnet-lab cluster up --dir) is dir: its
// kubeconfig, and BUSYBOX_IMAGE and REGISTRY of its env file.
func ScenarioTargetFromDir(dir string) (ScenarioTarget, error) {
	env, err := ReadEnv(dir)
	if err != nil {
		return ScenarioTarget{}, err
	}
	kubeconfig := filepath.Join(dir, KubeconfigFile)
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return ScenarioTarget{}, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return ScenarioTarget{}, err
	}
	for _, k := range []string{"BUSYBOX_IMAGE", "REGISTRY"} {
		if env[k] == "" {
			return ScenarioTarget{}, fmt.Errorf("env file %s: no %s", filepath.Join(dir, EnvFile), k)
		}
	}
	return ScenarioTarget{Config: cfg, Client: cs, Image: env["BUSYBOX_IMAGE"], EgressURL: "http://" + env["REGISTRY"] + "/v2/", GuestImage: env["GUEST_IMAGE"],
		EgressListen: HostIP, NodeNetns: nodeNetnsPath, Datacenter: PhysHostIP, DualStack: env["IP_FAMILY"] == IPFamilyDual}, nil
}

// ReadEnv reads the env file of the cluster whose state directory is
// dir: its shell assignments (KUBECONFIG, REGISTRY, BUSYBOX_IMAGE,
// KVNET_REGISTRY, KVNET_TAG, ...).
func ReadEnv(dir string) (map[string]string, error) {
	path := filepath.Join(dir, EnvFile)
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return nil, fmt.Errorf("env file %s: line %q: no assignment", path, l)
		}
		env[k] = strings.Trim(v, `"`)
	}
	return env, sc.Err()
}

// ScenarioResult is the outcome of one scenario.
type ScenarioResult struct {
	// Name is one of PodScenarios or VMScenarios.
	Name string
	// OK is true when every check of the scenario passed.
	OK bool
	// Blocked is true when the scenario cannot run on this machine for a
	// reason outside the project (a kernel feature it lacks); Detail says
	// which. A blocked scenario is not OK.
	Blocked bool
	// Detail says what was seen: the addresses and answers when OK, the
	// first failed check otherwise; and observations that are not (yet)
	// checks, such as which interface network-status marks default.
	Detail string
	// Took is how long the scenario ran (0: not measured).
	Took time.Duration
}

func (r ScenarioResult) String() string {
	s := "PASS"
	switch {
	case r.Blocked:
		s = "BLOCKED"
	case !r.OK:
		s = "FAIL"
	}
	if r.Took > 0 {
		return fmt.Sprintf("%s %s [%s]: %s", s, r.Name, r.Took.Round(100*time.Millisecond), r.Detail)
	}
	return fmt.Sprintf("%s %s: %s", s, r.Name, r.Detail)
}

// scenarioPod is one pod of the scenarios, as found once Ready.
type scenarioPod struct {
	ns, name, node string
	pod            *corev1.Pod
	err            error // why it is not there or not Ready
}

func (p *scenarioPod) String() string { return p.ns + "/" + p.name }

// NetworkStatus is an element of a pod's k8s.v1.cni.cncf.io/network-status.
type NetworkStatus struct {
	Name      string   `json:"name"`
	Interface string   `json:"interface"`
	IPs       []string `json:"ips"`
	MAC       string   `json:"mac"`
	Default   bool     `json:"default"`
}

// networkStatus parses the pod's network-status.
func (p *scenarioPod) networkStatus() ([]NetworkStatus, error) {
	s, ok := p.pod.Annotations[networkStatusAnnotation]
	if !ok {
		return nil, fmt.Errorf("pod %s: no %s annotation", p, networkStatusAnnotation)
	}
	var st []NetworkStatus
	if err := json.Unmarshal([]byte(s), &st); err != nil {
		return nil, fmt.Errorf("pod %s: %s %q: %w", p, networkStatusAnnotation, s, err)
	}
	return st, nil
}

// addr returns the pod's IPv4 address on iface from its network-status,
// checked to be in want.
func (p *scenarioPod) addr(iface string, want netip.Prefix) (netip.Addr, error) {
	return p.addrOf(iface, want, false)
}

// addr6 is addr for the pod's IPv6 address.
func (p *scenarioPod) addr6(iface string, want netip.Prefix) (netip.Addr, error) {
	return p.addrOf(iface, want, true)
}

// addrOf returns the pod's address of a family (v6) on iface from its
// network-status, checked to be in want.
func (p *scenarioPod) addrOf(iface string, want netip.Prefix, v6 bool) (netip.Addr, error) {
	st, err := p.networkStatus()
	if err != nil {
		return netip.Addr{}, err
	}
	for _, s := range st {
		if s.Interface != iface {
			continue
		}
		for _, ip := range s.IPs {
			a, err := netip.ParseAddr(ip)
			if err == nil && a.Is6() == v6 {
				if !want.Contains(a) {
					return netip.Addr{}, fmt.Errorf("pod %s: %s address %s not in %s", p, iface, a, want)
				}
				return a, nil
			}
		}
	}
	family := "IPv4"
	if v6 {
		family = "IPv6"
	}
	return netip.Addr{}, fmt.Errorf("pod %s: no %s address on %s in network-status %s", p, family, iface, p.pod.Annotations[networkStatusAnnotation])
}

type scenarios struct {
	t     ScenarioTarget
	dyn   dynamic.Interface
	out   io.Writer
	nodes [2]string
	pods  map[string]*scenarioPod // by ns/name
	// matrixNodes are the nodes of the policy model's pods a, b and c.
	matrixNodes []string
}

func (s *scenarios) logf(format string, args ...any) {
	fmt.Fprintf(s.out, "scenarios: "+format+"\n", args...)
}

// RunPodScenarios removes what a previous run left (CleanupPodScenarios),
// creates the scenarios' namespaces (labelled ScenarioLabel), networks,
// Service and pods, and runs every scenario of PodScenarios, returning
// one result each, in that order. Progress and each result go to out as
// lines. The objects stay for the user to explore; CleanupPodScenarios
// removes them. The error reports what kept the scenarios from running
// (the API refusing their objects, fewer than two nodes); a scenario
// that fails is a result, not an error.
func RunPodScenarios(ctx context.Context, t ScenarioTarget, out io.Writer) ([]ScenarioResult, error) {
	if out == nil {
		out = io.Discard
	}
	if t.Config == nil || t.Client == nil {
		return nil, errors.New("scenarios: target without API config or client")
	}
	if t.Image == "" {
		return nil, errors.New("scenarios: target without workload image (Image)")
	}
	for _, name := range t.Skip {
		if !slices.Contains(PodScenarios, name) && name != ScenarioDualStack {
			return nil, fmt.Errorf("scenarios: Skip names %q, not a pod scenario (%v)", name, PodScenarios)
		}
	}
	if t.PodTimeout == 0 {
		t.PodTimeout = 4 * time.Minute
	}
	dyn, err := dynamic.NewForConfig(t.Config)
	if err != nil {
		return nil, err
	}
	s := &scenarios{t: t, dyn: dyn, out: out, pods: map[string]*scenarioPod{}}
	nodes := t.Nodes
	if len(nodes) == 0 {
		if nodes, err = readyNodes(ctx, t.Client); err != nil {
			return nil, err
		}
	}
	if len(nodes) < 2 || nodes[0] == nodes[1] {
		return nil, fmt.Errorf("scenarios: nodes %v: want two different nodes", nodes)
	}
	s.nodes = [2]string{nodes[0], nodes[1]}

	s.logf("removing a previous run's objects")
	if err := CleanupPodScenarios(ctx, t, out); err != nil {
		return nil, err
	}
	if err := s.create(ctx); err != nil {
		return nil, err
	}
	s.waitPods(ctx)
	// The policy model's nine pods start once the others run: thick
	// Multus runs every delegate in its daemon's container, under a
	// memory limit (50 MiB upstream) that a node's burst of concurrent
	// ADDs can exceed.
	if !slices.Contains(t.Skip, ScenarioMatrix) {
		if err := s.createMatrix(ctx); err != nil {
			return nil, err
		}
		s.waitPods(ctx)
	}

	var results []ScenarioResult
	run := func(name string, f func(context.Context) (string, error)) {
		if slices.Contains(t.Skip, name) {
			s.logf("scenario %s: skipped (ScenarioTarget.Skip)", name)
			return
		}
		runScenario(ctx, out, &results, name, f)
	}
	run(ScenarioPrimaryReady, s.primaryReady)
	run(ScenarioPrimaryReach, s.primaryReach)
	run(ScenarioEth0Isolated, s.eth0Isolated)
	run(ScenarioTenantIsolation, s.tenantIsolation)
	run(ScenarioServiceDNS, s.serviceByName)
	run(ScenarioServiceAffinity, s.serviceAffinity)
	run(ScenarioNodePortLocal, s.nodePortLocal)
	run(ScenarioLoadBalancer, s.loadBalancer)
	run(ScenarioServiceOtherTenant, s.serviceOtherTenant)
	run(ScenarioHeadless, s.headless)
	run(ScenarioPolicy, s.policy)
	run(ScenarioMatrix, s.matrix)
	run(ScenarioEgress, s.egress)
	run(ScenarioSecondary, s.secondary)
	run(ScenarioMultiPolicy, s.multiPolicy)
	run(ScenarioCUDN, s.cudn)
	run(ScenarioLayer3, s.layer3)
	run(ScenarioLocalnet, s.localnet)
	if t.DualStack {
		run(ScenarioDualStack, s.dualStack)
	}
	return results, nil
}

// readyNodes returns the names of the Ready nodes, sorted.
func readyNodes(ctx context.Context, cs kubernetes.Interface) ([]string, error) {
	l, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("scenarios: list nodes: %w", err)
	}
	var names []string
	for i := range l.Items {
		if NodeReady(&l.Items[i]) && !l.Items[i].Spec.Unschedulable {
			names = append(names, l.Items[i].Name)
		}
	}
	sort.Strings(names)
	return names, nil
}

// CleanupPodScenarios deletes the namespaces and the
// ClusterUserDefinedNetwork the scenarios created (those labelled
// ScenarioLabel) and waits until they are gone.
func CleanupPodScenarios(ctx context.Context, t ScenarioTarget, out io.Writer) error {
	return errors.Join(dropLBRoutes(), cleanupLabelled(ctx, t, out, ScenarioLabel))
}

// cleanupLabelled deletes the namespaces and ClusterUserDefinedNetworks
// labelled label and waits until they are gone.
func cleanupLabelled(ctx context.Context, t ScenarioTarget, out io.Writer, label string) error {
	if out == nil {
		out = io.Discard
	}
	dyn, err := dynamic.NewForConfig(t.Config)
	if err != nil {
		return err
	}
	sel := metav1.ListOptions{LabelSelector: label}
	fg := metav1.DeletePropagationForeground
	del := metav1.DeleteOptions{PropagationPolicy: &fg}
	listCUDNs := func() ([]string, error) {
		l, err := dyn.Resource(cudnGVR).List(ctx, sel)
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return nil, nil // no CUDN CRD: kvnet is not installed
		}
		if err != nil {
			return nil, fmt.Errorf("list ClusterUserDefinedNetworks: %w", err)
		}
		var names []string
		for _, o := range l.Items {
			names = append(names, "ClusterUserDefinedNetwork "+o.GetName())
		}
		return names, nil
	}
	listNamespaces := func() ([]string, error) {
		l, err := t.Client.CoreV1().Namespaces().List(ctx, sel)
		if err != nil {
			return nil, fmt.Errorf("list namespaces: %w", err)
		}
		var names []string
		for _, n := range l.Items {
			names = append(names, "namespace "+n.Name)
		}
		return names, nil
	}
	cudns, err := listCUDNs()
	if err != nil {
		return err
	}
	nss, err := listNamespaces()
	if err != nil {
		return err
	}
	if len(cudns)+len(nss) == 0 {
		return nil
	}
	fmt.Fprintf(out, "scenarios: deleting %s\n", strings.Join(append(nss, cudns...), ", "))
	// The CUDN waits for its pods to go, which the namespaces' deletion
	// removes: delete both, then wait for both.
	for _, c := range cudns {
		name := strings.TrimPrefix(c, "ClusterUserDefinedNetwork ")
		if err := dyn.Resource(cudnGVR).Delete(ctx, name, del); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete ClusterUserDefinedNetwork %q: %w", name, err)
		}
	}
	for _, n := range nss {
		name := strings.TrimPrefix(n, "namespace ")
		if err := t.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete namespace %q: %w", name, err)
		}
	}
	return poll(ctx, 4*time.Minute, func(context.Context) error {
		cudns, err := listCUDNs()
		if err != nil {
			return err
		}
		nss, err := listNamespaces()
		if err != nil {
			return err
		}
		if left := append(nss, cudns...); len(left) > 0 {
			return fmt.Errorf("scenarios: cleanup: still there: %s", strings.Join(left, ", "))
		}
		return nil
	})
}

// create makes the scenarios' objects: namespaces, networks, the
// Service, then the pods once their networks' NADs exist.
func (s *scenarios) create(ctx context.Context) error {
	cs := s.t.Client
	s.logf("creating namespaces, networks and pods on %s and %s", s.nodes[0], s.nodes[1])
	for _, ns := range []struct {
		name    string
		primary bool
	}{{nsTenantA, true}, {nsTenantB, true}, {nsPlain, false}, {nsSecondary, false}, {nsRed, true}, {nsBlue, true}, {nsLayer3, true}, {nsPolicy, true}, {nsLocalnet, false}} {
		labels := map[string]string{ScenarioLabel: ""}
		if ns.primary {
			labels[primaryLabel] = ""
		}
		o := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns.name, Labels: labels}}
		if _, err := cs.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("scenarios: create namespace %q: %w", ns.name, err)
		}
	}
	layer2 := func(ns, name, role string, subnet netip.Prefix, reserved ...netip.Prefix) *unstructured.Unstructured {
		l2 := map[string]any{"role": role, "subnets": []any{subnet.String()}}
		if len(reserved) > 0 {
			var r []any
			for _, p := range reserved {
				r = append(r, p.String())
			}
			l2["reservedSubnets"] = r
		}
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "k8s.ovn.org/v1", "kind": "UserDefinedNetwork",
			"metadata": map[string]any{"name": name, "namespace": ns},
			"spec":     map[string]any{"topology": "Layer2", "layer2": l2},
		}}
	}
	udns := []*unstructured.Unstructured{
		layer2(nsTenantA, "net", "Primary", tenantSubnet),
		layer2(nsTenantB, "net", "Primary", tenantSubnet, tenantBReserved),
		layer2(nsSecondary, "sec", "Secondary", secondarySubnet),
		layer2(nsPolicy, "net", "Primary", policySubnet),
		{Object: map[string]any{
			"apiVersion": "k8s.ovn.org/v1", "kind": "UserDefinedNetwork",
			"metadata": map[string]any{"name": "net", "namespace": nsLayer3},
			"spec": map[string]any{"topology": "Layer3", "layer3": map[string]any{
				"role": "Primary", "subnets": []any{map[string]any{"cidr": layer3Subnet.String(), "hostSubnet": int64(24)}},
			}},
		}},
	}
	for _, u := range udns {
		if _, err := s.dyn.Resource(udnGVR).Namespace(u.GetNamespace()).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("scenarios: create UserDefinedNetwork %s/%s: %w", u.GetNamespace(), u.GetName(), err)
		}
	}
	cudn := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "k8s.ovn.org/v1", "kind": "ClusterUserDefinedNetwork",
		"metadata": map[string]any{"name": cudnName, "labels": map[string]any{ScenarioLabel: ""}},
		"spec": map[string]any{
			"namespaceSelector": map[string]any{"matchExpressions": []any{map[string]any{
				"key": "kubernetes.io/metadata.name", "operator": "In", "values": []any{nsRed, nsBlue},
			}}},
			"network": map[string]any{"topology": "Layer2", "layer2": map[string]any{
				"role": "Primary", "subnets": []any{cudnSubnet.String()},
			}},
		},
	}}
	if _, err := s.dyn.Resource(cudnGVR).Create(ctx, cudn, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("scenarios: create ClusterUserDefinedNetwork %s: %w", cudnName, err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: nsTenantA},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
		},
	}
	if _, err := cs.CoreV1().Services(nsTenantA).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("scenarios: create Service %s/web: %w", nsTenantA, err)
	}
	sticky := svc.DeepCopy()
	sticky.Name = "web-sticky"
	sticky.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	if _, err := cs.CoreV1().Services(nsTenantA).Create(ctx, sticky, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("scenarios: create Service %s/web-sticky: %w", nsTenantA, err)
	}
	for name, policy := range map[string]corev1.ServiceExternalTrafficPolicy{
		"web-np": corev1.ServiceExternalTrafficPolicyCluster, "web-local": corev1.ServiceExternalTrafficPolicyLocal,
	} {
		np := svc.DeepCopy()
		np.Name, np.Spec.Type, np.Spec.ExternalTrafficPolicy = name, corev1.ServiceTypeNodePort, policy
		if _, err := cs.CoreV1().Services(nsTenantA).Create(ctx, np, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("scenarios: create Service %s/%s: %w", nsTenantA, name, err)
		}
	}
	if err := s.createLocalnet(ctx); err != nil {
		return err
	}
	if err := s.createLoadBalancers(ctx, svc); err != nil {
		return err
	}
	if err := s.createHeadless(ctx); err != nil {
		return err
	}
	polWeb := svc.DeepCopy()
	polWeb.Namespace = nsPolicy
	if _, err := cs.CoreV1().Services(nsPolicy).Create(ctx, polWeb, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("scenarios: create Service %s/web: %w", nsPolicy, err)
	}

	// Each namespace needs its default ServiceAccount, and a namespace
	// of a network its NAD, before its pods: the primary-network webhook
	// refuses a pod of a labelled namespace no network serves yet.
	nads := map[string]string{nsTenantA: "net", nsTenantB: "net", nsSecondary: "sec", nsRed: cudnName, nsBlue: cudnName, nsLayer3: "net", nsPolicy: "net", nsPlain: ""}
	if s.t.Datacenter.IsValid() {
		nads[nsLocalnet] = localnetName
	}
	if err := s.waitNamespaces(ctx, nads); err != nil {
		return err
	}

	type podSpec struct {
		ns, name string
		node     int
		networks string
	}
	specs := []podSpec{
		{nsTenantA, "a-1", 0, ""}, {nsTenantA, "a-2", 1, ""},
		{nsTenantB, "b-1", 0, ""}, {nsTenantB, "b-2", 1, ""},
		{nsPlain, "plain-1", 0, ""}, {nsPlain, "plain-2", 1, ""},
		{nsSecondary, "sec-1", 0, "sec"}, {nsSecondary, "sec-2", 1, "sec"},
		{nsRed, "red-1", 0, ""}, {nsBlue, "blue-1", 1, ""},
		{nsLayer3, "l3-1", 0, ""}, {nsLayer3, "l3-2", 1, ""},
		{nsPolicy, "pol-1", 0, ""}, {nsPolicy, "pol-2", 1, ""},
	}
	if s.t.Datacenter.IsValid() {
		specs = append(specs, podSpec{nsLocalnet, "loc-1", 0, localnetName}, podSpec{nsLocalnet, "loc-2", 1, localnetName})
	}
	if s.t.DualStack {
		if err := s.createDualStack(ctx); err != nil {
			return err
		}
	}
	for _, sp := range specs {
		p := webPod(sp.ns, sp.name, s.nodes[sp.node], s.t.Image)
		p.Labels[podLabel] = sp.name
		if sp.ns == nsTenantA {
			// Their names under the headless Service (ScenarioHeadless).
			p.Spec.Hostname, p.Spec.Subdomain = sp.name, headlessName
		}
		if sp.networks != "" {
			p.Annotations = map[string]string{networksAnnotation: sp.networks}
		}
		s.createPod(ctx, p)
	}
	return nil
}

// waitNamespaces waits until each namespace has its default
// ServiceAccount and, where nads names one, its NAD: a namespace of a
// network needs the NAD before its pods, or the primary-network webhook
// refuses them.
func (s *scenarios) waitNamespaces(ctx context.Context, nads map[string]string) error {
	for ns, nad := range nads {
		err := poll(ctx, 2*time.Minute, func(ctx context.Context) error {
			if _, err := s.t.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err != nil {
				return fmt.Errorf("ServiceAccount %s/default: %w", ns, err)
			}
			if nad == "" {
				return nil
			}
			if _, err := s.dyn.Resource(nadGVR).Namespace(ns).Get(ctx, nad, metav1.GetOptions{}); err != nil {
				return fmt.Errorf("NAD %s/%s (kvnet-controller renders it from the network): %w", ns, nad, err)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("scenarios: %w", err)
		}
	}
	return nil
}

// createPod creates p and records it among the scenarios' pods (on the
// node its selector names), or why it could not be created.
func (s *scenarios) createPod(ctx context.Context, p *corev1.Pod) {
	sc := &scenarioPod{ns: p.Namespace, name: p.Name, node: p.Spec.NodeSelector[corev1.LabelHostname]}
	s.pods[sc.String()] = sc
	// The webhook may refuse a pod for a moment after its NAD appears
	// (its cache lags): retry, and keep the last refusal.
	sc.err = poll(ctx, time.Minute, func(ctx context.Context) error {
		_, err := s.t.Client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		return nil
	})
}

// runScenario runs f as scenario name and appends its result to
// results, printing it to out.
func runScenario(ctx context.Context, out io.Writer, results *[]ScenarioResult, name string, f func(context.Context) (string, error)) {
	start := time.Now()
	detail, err := f(ctx)
	r := ScenarioResult{Name: name, OK: err == nil, Detail: detail, Took: time.Since(start)}
	var b *blockedError
	if errors.As(err, &b) {
		r.Blocked = true
	}
	if err != nil {
		r.Detail = err.Error()
		if detail != "" {
			r.Detail += " (" + detail + ")"
		}
	}
	fmt.Fprintln(out, r)
	*results = append(*results, r)
}

// waitPods waits for every pod to be Ready (or PodTimeout to pass) and
// records each pod, or why it is not Ready.
func (s *scenarios) waitPods(ctx context.Context) {
	s.logf("waiting for %d pods to be Ready", len(s.pods))
	deadline := time.Now().Add(s.t.PodTimeout)
	keys := make([]string, 0, len(s.pods))
	for k := range s.pods {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p := s.pods[k]
		if p.err != nil {
			continue
		}
		var last *corev1.Pod
		err := poll(ctx, time.Until(deadline), func(ctx context.Context) error {
			got, err := s.t.Client.CoreV1().Pods(p.ns).Get(ctx, p.name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			last = got
			if !PodReady(got) {
				return errors.New("not Ready")
			}
			return nil
		})
		switch {
		case err == nil:
			p.pod = last
		case last != nil:
			p.err = fmt.Errorf("pod %s on %s not Ready after %s: %s", p, p.node, s.t.PodTimeout, podNotReady(ctx, s.t.Client, last))
		default:
			p.err = fmt.Errorf("pod %s: %w", p, err)
		}
	}
	ready := 0
	for _, p := range s.pods {
		if p.err == nil {
			ready++
		}
	}
	s.logf("%d of %d pods Ready", ready, len(s.pods))
}

// need returns the named pods (ns/name), re-read from the API server
// (for their latest annotations), or the first one's problem.
func (s *scenarios) need(ctx context.Context, names ...string) ([]*scenarioPod, error) {
	var ps []*scenarioPod
	for _, n := range names {
		p := s.pods[n]
		if p.err != nil {
			return nil, p.err
		}
		got, err := s.t.Client.CoreV1().Pods(p.ns).Get(ctx, p.name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("get pod %s: %w", p, err)
		}
		p.pod = got
		ps = append(ps, p)
	}
	return ps, nil
}

// execTimeout bounds one exec into a pod.
const execTimeout = 30 * time.Second

// fetch runs httpget in pod p against url with the given timeout and
// returns its body, its stderr and the command's error.
func (s *scenarios) fetch(ctx context.Context, p *scenarioPod, url string, timeout time.Duration) (string, string, error) {
	ctx, cancel := context.WithTimeout(ctx, execTimeout)
	defer cancel()
	return PodExec(ctx, s.t.Config, s.t.Client, p.ns, p.name, "httpget", "-timeout", timeout.String(), url)
}

// reachTimeout bounds the wait for a connection that must work; each
// try gives up after reachTry.
const (
	reachTimeout = time.Minute
	reachTry     = 3 * time.Second
	// unreachTry is how long a connection that must not work is given:
	// it is tried once, after the same probe reached a target that is
	// allowed.
	unreachTry = 3 * time.Second
)

// reach waits until pod p fetches url and gets a body starting with want.
func (s *scenarios) reach(ctx context.Context, p *scenarioPod, url, want string) (string, error) {
	var body string
	err := poll(ctx, reachTimeout, func(ctx context.Context) error {
		out, errOut, err := s.fetch(ctx, p, url, reachTry)
		if err != nil {
			return fmt.Errorf("%s: httpget %s: %v: %s", p, url, err, strings.TrimSpace(errOut))
		}
		body = strings.TrimSpace(out)
		if !strings.HasPrefix(body, want) {
			return fmt.Errorf("%s: httpget %s: got %q, want %q", p, url, body, want)
		}
		return nil
	})
	return body, err
}

// notReachedErrors are httpget's errors for a connection nothing
// answered: dropped (timeout), refused by the pod's own rules (EPERM),
// unanswered ARP or an ICMP unreachable.
var notReachedErrors = []string{"Client.Timeout exceeded", "i/o timeout", "deadline exceeded", "operation not permitted", "no route to host", "network is unreachable"}

// unreached checks that pod p does not reach url: httpget fails with an
// error saying nothing answered. Call it after the same pod has reached
// an allowed target with the same probe, so that a failure is the
// network's and not the probe's. A refused connection counts as reached:
// something answered.
func (s *scenarios) unreached(ctx context.Context, p *scenarioPod, url string) error {
	out, errOut, err := s.fetch(ctx, p, url, unreachTry)
	if err == nil {
		return fmt.Errorf("%s reached %s, which it must not: got %q", p, url, strings.TrimSpace(out))
	}
	if code, ok := ExitStatus(err); !ok || code != 1 {
		return fmt.Errorf("%s: httpget %s: %v: %s", p, url, err, strings.TrimSpace(errOut))
	}
	for _, e := range notReachedErrors {
		if strings.Contains(errOut, e) {
			return nil
		}
	}
	return fmt.Errorf("%s: httpget %s failed, but not for want of an answer: %s", p, url, strings.TrimSpace(errOut))
}

func webURL(a netip.Addr) string { return "http://" + netip.AddrPortFrom(a, 8080).String() + "/" }

// reachEachOther checks that pods x and y fetch each other's page at
// their iface addresses in subnet, and returns the addresses.
func (s *scenarios) reachEachOther(ctx context.Context, x, y *scenarioPod, iface string, subnet netip.Prefix) (string, error) {
	if x.pod.Spec.NodeName == y.pod.Spec.NodeName {
		return "", fmt.Errorf("pods %s and %s both on node %s", x, y, x.pod.Spec.NodeName)
	}
	ax, err := x.addr(iface, subnet)
	if err != nil {
		return "", err
	}
	ay, err := y.addr(iface, subnet)
	if err != nil {
		return "", err
	}
	if _, err := s.reach(ctx, x, webURL(ay), "hello from "+y.name); err != nil {
		return "", err
	}
	if _, err := s.reach(ctx, y, webURL(ax), "hello from "+x.name); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s (%s) %s:%s <-> %s (%s) %s:%s", x, x.pod.Spec.NodeName, iface, ax, y, y.pod.Spec.NodeName, iface, ay), nil
}

// primaryReady: a-1 and a-2 Ready on two nodes, never restarted (the
// liveness probe holds), each with an ovn-udn1 address of the subnet
// that the interface carries. Notes which interface network-status
// marks default.
func (s *scenarios) primaryReady(ctx context.Context) (string, error) {
	ps, err := s.need(ctx, nsTenantA+"/a-1", nsTenantA+"/a-2")
	if err != nil {
		return "", err
	}
	if ps[0].pod.Spec.NodeName == ps[1].pod.Spec.NodeName {
		return "", fmt.Errorf("pods %s and %s both on node %s", ps[0], ps[1], ps[0].pod.Spec.NodeName)
	}
	var details []string
	for _, p := range ps {
		for _, c := range p.pod.Status.ContainerStatuses {
			if c.RestartCount > 0 {
				return "", fmt.Errorf("pod %s: container %s restarted %d times (liveness probe failing?)", p, c.Name, c.RestartCount)
			}
		}
		a, err := p.addr(primaryInterface, tenantSubnet)
		if err != nil {
			return "", err
		}
		ctx, cancel := context.WithTimeout(ctx, execTimeout)
		out, errOut, err := PodExec(ctx, s.t.Config, s.t.Client, p.ns, p.name, "ip", "-4", "addr", "show", "dev", primaryInterface)
		cancel()
		if err != nil {
			return "", fmt.Errorf("pod %s: ip addr show dev %s: %v: %s", p, primaryInterface, err, errOut)
		}
		if !strings.Contains(out, "inet "+a.String()+"/") {
			return "", fmt.Errorf("pod %s: %s lacks its network-status address %s: %s", p, primaryInterface, a, strings.TrimSpace(out))
		}
		st, _ := p.networkStatus()
		var def []string
		for _, e := range st {
			if e.Default {
				def = append(def, e.Interface)
			}
		}
		if len(def) == 0 {
			def = []string{"none"}
		}
		details = append(details, fmt.Sprintf("%s Ready on %s, %s %s, network-status marks default: %s", p, p.pod.Spec.NodeName,
			primaryInterface, a, strings.Join(def, "+")))
	}
	return strings.Join(details, "; "), nil
}

// primaryReach: a-1 and a-2 fetch each other's page at their ovn-udn1
// addresses.
func (s *scenarios) primaryReach(ctx context.Context) (string, error) {
	ps, err := s.need(ctx, nsTenantA+"/a-1", nsTenantA+"/a-2")
	if err != nil {
		return "", err
	}
	return s.reachEachOther(ctx, ps[0], ps[1], primaryInterface, tenantSubnet)
}

// eth0Isolated: a UDN pod's eth0 holds its pod IP, in its node's pod
// CIDR; a default-network pod reaches another (the control), but not a
// UDN pod's eth0; the UDN pod, which reaches its peer over ovn-udn1 (the
// control), reaches neither the default-network pod nor its peer's eth0.
func (s *scenarios) eth0Isolated(ctx context.Context) (string, error) {
	ps, err := s.need(ctx, nsTenantA+"/a-1", nsTenantA+"/a-2", nsPlain+"/plain-1", nsPlain+"/plain-2")
	if err != nil {
		return "", err
	}
	a1, a2, plain1, plain2 := ps[0], ps[1], ps[2], ps[3]
	for _, p := range []*scenarioPod{a1, a2} {
		node, err := s.t.Client.CoreV1().Nodes().Get(ctx, p.pod.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		ip, err := netip.ParseAddr(p.pod.Status.PodIP)
		if err != nil {
			return "", fmt.Errorf("pod %s: status.podIP %q: %w", p, p.pod.Status.PodIP, err)
		}
		if !inPodCIDRs(node, ip) {
			return "", fmt.Errorf("pod %s: pod IP %s not in node %s's pod CIDRs %v", p, ip, node.Name, node.Spec.PodCIDRs)
		}
		eth0, err := p.addr("eth0", netip.PrefixFrom(ip, ip.BitLen()))
		if err != nil {
			return "", fmt.Errorf("%w (want the pod IP %s there)", err, ip)
		}
		ctx, cancel := context.WithTimeout(ctx, execTimeout)
		out, errOut, err := PodExec(ctx, s.t.Config, s.t.Client, p.ns, p.name, "ip", "-4", "addr", "show", "dev", "eth0")
		cancel()
		if err != nil {
			return "", fmt.Errorf("pod %s: ip addr show dev eth0: %v: %s", p, err, errOut)
		}
		if !strings.Contains(out, "inet "+eth0.String()+"/") {
			return "", fmt.Errorf("pod %s: eth0 lacks the pod IP %s: %s", p, eth0, strings.TrimSpace(out))
		}
	}
	a2UDN, err := a2.addr(primaryInterface, tenantSubnet)
	if err != nil {
		return "", err
	}
	// Controls: the same probes, to targets that are allowed.
	if _, err := s.reach(ctx, plain1, webURL(netip.MustParseAddr(plain2.pod.Status.PodIP)), "hello from plain-2"); err != nil {
		return "", fmt.Errorf("control: %w", err)
	}
	if _, err := s.reach(ctx, a1, webURL(a2UDN), "hello from a-2"); err != nil {
		return "", fmt.Errorf("control: %w", err)
	}
	for _, c := range []struct {
		from *scenarioPod
		to   string
	}{
		{a1, plain2.pod.Status.PodIP}, // a default-network pod, through eth0
		{a1, a2.pod.Status.PodIP},     // the other UDN pod's eth0
		{plain1, a2.pod.Status.PodIP}, // a default-network pod to a UDN pod's eth0
	} {
		if err := s.unreached(ctx, c.from, webURL(netip.MustParseAddr(c.to))); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("eth0 %s (a-1), %s (a-2) = pod IPs; plain-1 reaches plain-2 %s and a-1 reaches a-2 on %s %s; "+
		"a-1 reaches neither plain-2 nor a-2's eth0, plain-1 not a-2's eth0",
		a1.pod.Status.PodIP, a2.pod.Status.PodIP, plain2.pod.Status.PodIP, primaryInterface, a2UDN), nil
}

func inPodCIDRs(n *corev1.Node, a netip.Addr) bool {
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil && p.Contains(a) {
			return true
		}
	}
	return false
}

// tenantIsolation: tenants A and B, on the same subnet, each reach their
// own peer (the controls) and neither reaches the other's pods.
func (s *scenarios) tenantIsolation(ctx context.Context) (string, error) {
	ps, err := s.need(ctx, nsTenantA+"/a-1", nsTenantA+"/a-2", nsTenantB+"/b-1", nsTenantB+"/b-2")
	if err != nil {
		return "", err
	}
	addrs := map[*scenarioPod]netip.Addr{}
	seen := map[netip.Addr]*scenarioPod{}
	for _, p := range ps {
		a, err := p.addr(primaryInterface, tenantSubnet)
		if err != nil {
			return "", err
		}
		if q, dup := seen[a]; dup {
			return "", fmt.Errorf("pods %s and %s both hold %s: a probe could not tell who answered", q, p, a)
		}
		seen[a], addrs[p] = p, a
	}
	a1, a2, b1, b2 := ps[0], ps[1], ps[2], ps[3]
	if _, err := s.reach(ctx, a1, webURL(addrs[a2]), "hello from a-2"); err != nil {
		return "", fmt.Errorf("control: %w", err)
	}
	if _, err := s.reach(ctx, b1, webURL(addrs[b2]), "hello from b-2"); err != nil {
		return "", fmt.Errorf("control: %w", err)
	}
	for _, c := range [][2]*scenarioPod{{a1, b1}, {a1, b2}, {b1, a1}, {b1, a2}} {
		if err := s.unreached(ctx, c[0], webURL(addrs[c[1]])); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("both on %s: a-1 %s, a-2 %s, b-1 %s, b-2 %s; each reaches its peer, a-1 neither b pod, b-1 neither a pod",
		tenantSubnet, addrs[a1], addrs[a2], addrs[b1], addrs[b2]), nil
}

// serviceByName: a-1 fetches http://web.<ns>.svc.cluster.local/, the
// ClusterIP Service of a-1 and a-2, resolved by the cluster DNS, until
// both backends have answered.
func (s *scenarios) serviceByName(ctx context.Context) (string, error) {
	ps, err := s.need(ctx, nsTenantA+"/a-1", nsTenantA+"/a-2")
	if err != nil {
		return "", err
	}
	svc, err := s.t.Client.CoreV1().Services(nsTenantA).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	url := "http://web." + nsTenantA + ".svc.cluster.local/"
	seen, err := reachAll(ctx, serviceTries, func(ctx context.Context) (string, error) {
		out, errOut, err := s.fetch(ctx, ps[0], url, reachTry)
		if err != nil {
			return "", fmt.Errorf("%s: httpget %s: %v: %s", ps[0], url, err, strings.TrimSpace(errOut))
		}
		return strings.TrimSpace(out), nil
	}, []string{"hello from a-1", "hello from a-2"})
	if err != nil {
		return "", fmt.Errorf("service %s/web (cluster IP %s): %w", nsTenantA, svc.Spec.ClusterIP, err)
	}
	return fmt.Sprintf("a-1 fetched %s (cluster IP %s) from both backends: %s", url, svc.Spec.ClusterIP, seen), nil
}

// affinityTries is how many connections serviceAffinity makes to the
// Service with client affinity: without it, all of them reaching one of
// two backends has a chance of 2^-(affinityTries-1).
const affinityTries = 16

// serviceAffinity: a-1 fetches Service web until both backends have
// answered (the control: they both serve), then Service web-sticky
// (sessionAffinity: ClientIP, the same backends) affinityTries times:
// every answer must come from one backend.
func (s *scenarios) serviceAffinity(ctx context.Context) (string, error) {
	ps, err := s.need(ctx, nsTenantA+"/a-1", nsTenantA+"/a-2")
	if err != nil {
		return "", err
	}
	fetch := func(url string) func(ctx context.Context) (string, error) {
		return func(ctx context.Context) (string, error) {
			out, errOut, err := s.fetch(ctx, ps[0], url, reachTry)
			if err != nil {
				return "", fmt.Errorf("%s: httpget %s: %v: %s", ps[0], url, err, strings.TrimSpace(errOut))
			}
			return strings.TrimSpace(out), nil
		}
	}
	want := []string{"hello from a-1", "hello from a-2"}
	control, err := reachAll(ctx, serviceTries, fetch("http://web."+nsTenantA+".svc.cluster.local/"), want)
	if err != nil {
		return "", fmt.Errorf("control, Service %s/web without affinity: %w", nsTenantA, err)
	}
	count, err := answers(ctx, affinityTries, fetch("http://web-sticky."+nsTenantA+".svc.cluster.local/"), want)
	if err != nil {
		return "", fmt.Errorf("service %s/web-sticky: %w", nsTenantA, err)
	}
	if len(count) != 1 {
		return "", fmt.Errorf("service %s/web-sticky (sessionAffinity: ClientIP): a-1's %d connections were answered by %v, want one backend only", nsTenantA, affinityTries, count)
	}
	var pinned string
	for body := range count {
		pinned = body
	}
	return fmt.Sprintf("a-1's %d connections to web-sticky (ClientIP affinity) all answered %q; web without it answered %s", affinityTries, pinned, control), nil
}

// nodePortLocal: this host fetches Service web-np (NodePort, policy
// Cluster: the control) at a node with neither backend until both have
// answered, then Service web-local (NodePort, policy Local) at a-1's and
// a-2's nodes, each answered by its own backend only, affinityTries
// times, and at the node with neither: the connection must be dropped
// (no answer, and no refusal either).
func (s *scenarios) nodePortLocal(ctx context.Context) (string, error) {
	ps, err := s.need(ctx, nsTenantA+"/a-1", nsTenantA+"/a-2")
	if err != nil {
		return "", err
	}
	addrOf, other, err := s.nodeAddrs(ctx, ps)
	if err != nil {
		return "", err
	}
	nodePort := func(name string) (int32, error) { return s.nodePort(ctx, name) }
	fetch := func(node string, port int32, timeout time.Duration) func(context.Context) (string, error) {
		url := fmt.Sprintf("http://%s/", net.JoinHostPort(addrOf[node], strconv.Itoa(int(port))))
		return func(ctx context.Context) (string, error) {
			body, err := hostFetch(ctx, url, timeout)
			if err != nil {
				return "", fmt.Errorf("this host to %s (node %s): %w", url, node, err)
			}
			return strings.TrimSpace(body), nil
		}
	}
	cluster, err := nodePort("web-np")
	if err != nil {
		return "", err
	}
	local, err := nodePort("web-local")
	if err != nil {
		return "", err
	}
	want := []string{"hello from a-1", "hello from a-2"}
	control, err := reachAll(ctx, serviceTries, fetch(other, cluster, reachTry), want)
	if err != nil {
		return "", fmt.Errorf("control, Service %s/web-np (policy Cluster) at node %s: %w", nsTenantA, other, err)
	}
	var details []string
	for _, p := range ps {
		f, own := fetch(p.pod.Spec.NodeName, local, reachTry), "hello from "+p.name
		// A first answer shows the node has programmed the Service.
		if err := poll(ctx, time.Minute, func(ctx context.Context) error { _, err := f(ctx); return err }); err != nil {
			return "", fmt.Errorf("service %s/web-local (policy Local) at %s's node: %w", nsTenantA, p, err)
		}
		count, err := answers(ctx, affinityTries, f, want)
		if err != nil {
			return "", fmt.Errorf("service %s/web-local (policy Local) at %s's node: %w", nsTenantA, p, err)
		}
		if len(count) != 1 || count[own] != affinityTries {
			return "", fmt.Errorf("service %s/web-local (policy Local) at %s's node %s: answered %v, want %q only", nsTenantA, p, p.pod.Spec.NodeName, count, own)
		}
		details = append(details, fmt.Sprintf("%s: %s ×%d", p.pod.Spec.NodeName, own, affinityTries))
	}
	body, err := fetch(other, local, unreachTry)(ctx)
	if err := droppedErr(body, err); err != nil {
		return "", fmt.Errorf("service %s/web-local (policy Local) at node %s, with no local endpoint: %w", nsTenantA, other, err)
	}
	return fmt.Sprintf("web-local (node port %d, policy Local) answered at %s; dropped at %s; web-np (node port %d, policy Cluster) there answered %s",
		local, strings.Join(details, ", "), other, cluster, control), nil
}

// hostFetch GETs url from this host, within timeout, and returns the
// body of a 200 answer.
func hostFetch(ctx context.Context, url string, timeout time.Duration) (string, error) {
	code, body, err := hostGet(ctx, url, timeout)
	if err != nil {
		return "", err
	}
	if code != http.StatusOK {
		return "", fmt.Errorf("%s: %d %s", url, code, http.StatusText(code))
	}
	return body, nil
}

// answers makes fetches until n of them answered, and returns how often
// each body came. A failed fetch (a slow or lost connection on a loaded
// machine) is retried, up to n failures in all; a body not in want fails
// at once.
func answers(ctx context.Context, n int, fetch func(context.Context) (string, error), want []string) (map[string]int, error) {
	count := map[string]int{}
	fails, got := 0, 0
	for got < n {
		body, err := fetch(ctx)
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil:
			if fails++; fails > n {
				return nil, fmt.Errorf("%d of %d connections failed, last: %w", fails, fails+got, err)
			}
			continue
		case !slices.Contains(want, body):
			return nil, fmt.Errorf("got %q, want one of %q", body, want)
		}
		count[body]++
		got++
	}
	return count, nil
}

// serviceTries bounds the fetches reachAll makes: with two endpoints
// drawn at random per connection, missing one in 40 fetches has a
// chance of 2^-39.
const serviceTries = 40

// reachAll calls fetch (one connection each) until every body in want
// has come back, at most tries times, and returns how often each came
// (e.g. "a-1 ×3, a-2 ×2"). A failed fetch counts as a try; a body not
// in want fails at once (a backend that is not the Service's). The
// error names the bodies that never came.
func reachAll(ctx context.Context, tries int, fetch func(context.Context) (string, error), want []string) (string, error) {
	count := map[string]int{}
	var lastErr error
	fails := 0
	for range tries {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		body, err := fetch(ctx)
		if err != nil {
			lastErr, fails = err, fails+1
			continue
		}
		known := false
		for _, w := range want {
			known = known || body == w
		}
		if !known {
			return "", fmt.Errorf("got %q, want one of %q", body, want)
		}
		count[body]++
		if len(count) == len(want) {
			break
		}
	}
	var got, missing []string
	for _, w := range want {
		if count[w] == 0 {
			missing = append(missing, fmt.Sprintf("%q", w))
		} else {
			got = append(got, fmt.Sprintf("%q ×%d", w, count[w]))
		}
	}
	if len(missing) > 0 {
		msg := fmt.Sprintf("no answer %s in %d tries (got %s; %d failed", strings.Join(missing, ", "), tries, strings.Join(got, ", "), fails)
		if lastErr != nil {
			msg += ", last: " + lastErr.Error()
		}
		return "", errors.New(msg + ")")
	}
	return strings.Join(got, ", "), nil
}

// egress: a-1 fetches the URL outside the cluster, and the egress
// server on this host: its node must have translated the router's
// transit address (the UDN's egress), not a-1's pod IP (eth0, Flannel's
// egress). The control: plain-1, a default-network pod on the same node,
// is seen leaving by its pod IP, so the check tells the two ways apart.
func (s *scenarios) egress(ctx context.Context) (string, error) {
	if s.t.EgressURL == "" {
		return "", errors.New("no URL outside the cluster to fetch (ScenarioTarget.EgressURL)")
	}
	if !s.t.EgressListen.IsValid() {
		return "", errors.New("no host address to serve the egress server on (ScenarioTarget.EgressListen)")
	}
	ps, err := s.need(ctx, nsTenantA+"/a-1", nsPlain+"/plain-1")
	if err != nil {
		return "", err
	}
	a1, plain1 := ps[0], ps[1]
	var body string
	err = poll(ctx, reachTimeout, func(ctx context.Context) error {
		out, errOut, err := s.fetch(ctx, a1, s.t.EgressURL, reachTry)
		if err != nil {
			return fmt.Errorf("%s: httpget %s: %v: %s", a1, s.t.EgressURL, err, strings.TrimSpace(errOut))
		}
		body = strings.TrimSpace(out)
		return nil
	})
	if err != nil {
		return "", err
	}
	srv, err := startEgressServer(s.t.EgressListen, s.t.NodeNetns)
	if err != nil {
		return "", err
	}
	defer srv.Close()
	var paths []string
	for _, c := range []struct {
		p    *scenarioPod
		want string
	}{{plain1, egressEth0}, {a1, egressUDN}} {
		eth0, err := netip.ParseAddr(c.p.pod.Status.PodIP)
		if err != nil {
			return "", fmt.Errorf("pod %s: status.podIP %q: %w", c.p, c.p.pod.Status.PodIP, err)
		}
		seen, origin, err := s.fetchEgress(ctx, c.p, srv)
		if err != nil {
			return "", err
		}
		path, err := egressPath(origin, eth0)
		if err == nil && path != c.want {
			err = fmt.Errorf("left through %s (the node translated %s), want %s", path, origin, c.want)
		}
		if err != nil {
			if c.p == plain1 {
				return "", fmt.Errorf("control: %s: %w", c.p, err)
			}
			return "", fmt.Errorf("%s: %w", c.p, err)
		}
		if c.want == egressUDN {
			if err := s.seenFromNode(ctx, c.p, seen.Addr()); err != nil {
				return "", err
			}
		}
		paths = append(paths, fmt.Sprintf("%s seen as %s, its node %s translated %s (%s)", c.p, seen, c.p.pod.Spec.NodeName, origin, path))
	}
	return fmt.Sprintf("a-1 fetched %s: %q; egress server %s: %s", s.t.EgressURL, body, srv.URL, strings.Join(paths, "; ")), nil
}

// seenFromNode checks that addr, where the outside saw pod p's
// connection come from, is p's node's InternalIP.
func (s *scenarios) seenFromNode(ctx context.Context, p *scenarioPod, addr netip.Addr) error {
	n, err := s.t.Client.CoreV1().Nodes().Get(ctx, p.pod.Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP && a.Address == addr.String() {
			return nil
		}
	}
	return fmt.Errorf("%s: the outside saw %s, not its node %s's InternalIP (%v)", p, addr, n.Name, n.Status.Addresses)
}

// secondary: sec-1 and sec-2 reach each other on net1, the secondary
// UDN's interface.
func (s *scenarios) secondary(ctx context.Context) (string, error) {
	ps, err := s.need(ctx, nsSecondary+"/sec-1", nsSecondary+"/sec-2")
	if err != nil {
		return "", err
	}
	return s.reachEachOther(ctx, ps[0], ps[1], "net1", secondarySubnet)
}

// cudn: red-1 and blue-1, in two namespaces the CUDN selects, reach each
// other over it.
func (s *scenarios) cudn(ctx context.Context) (string, error) {
	ps, err := s.need(ctx, nsRed+"/red-1", nsBlue+"/blue-1")
	if err != nil {
		return "", err
	}
	return s.reachEachOther(ctx, ps[0], ps[1], primaryInterface, cudnSubnet)
}

// layer3: l3-1 and l3-2 reach each other over the Layer3 network, each
// from its node's subnet.
func (s *scenarios) layer3(ctx context.Context) (string, error) {
	ps, err := s.need(ctx, nsLayer3+"/l3-1", nsLayer3+"/l3-2")
	if err != nil {
		return "", err
	}
	return s.reachEachOther(ctx, ps[0], ps[1], primaryInterface, layer3Subnet)
}
