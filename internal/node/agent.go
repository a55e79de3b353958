package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	mnpv1beta1 "kvnet.io/kvnet/api/k8scni/v1beta1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/cni"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/dnsproxy"
	"kvnet.io/kvnet/internal/migration"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/physnet"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/portalias"
	"kvnet.io/kvnet/internal/reserved"
)

// Config configures an Agent.
type Config struct {
	// NodeName is the Node this agent serves (the pod's spec.nodeName in
	// the DaemonSet).
	NodeName string
	// Datapath describes the node's datapath: underlay device and address,
	// MTU override, and (for simulated nodes) the namespace.
	Datapath datapath.NodeConfig
	// DNS servers handed out by DHCP (option 6) where the cluster DNS
	// Service does not exist.
	DNS []netip.Addr
	// ClusterDNS names the cluster DNS Service (default
	// kube-system/kube-dns), which pods on primary networks reach, and
	// ClusterDomain is the cluster's DNS domain (default cluster.local).
	ClusterDNS    types.NamespacedName
	ClusterDomain string
	// DNSProxyPort, when not 0, runs the DNS proxy for primary networks
	// at this port of each network's transit address on the node (see
	// Input.DNSProxyPort).
	DNSProxyPort uint16
	// ServiceCIDRs are the cluster's Service ranges beyond those of its
	// ServiceCIDR objects (which clusters before Kubernetes 1.33 may not
	// have).
	ServiceCIDRs []netip.Prefix
	// DefaultNetworkCIDRs are the cluster default network's pod ranges
	// beyond the Nodes' spec.podCIDRs (a default network whose IPAM has
	// pools of its own): primary networks reach no pod there either.
	DefaultNetworkCIDRs []netip.Prefix
	// Reserved are the cluster's reserved subnets (kvnet-node's
	// --masquerade-subnets, --join-subnets, --transit-subnets, the same as
	// kvnet-controller's); zero means the defaults. The join and transit
	// subnets serve primary networks whose NAD names none.
	Reserved reserved.Subnets
	// AllowDefaultNetwork tells kvnet-cni (through the status file) to
	// leave the cluster default network interface of primary-UDN pods
	// open; by default it admits only the node and replies.
	AllowDefaultNetwork bool
	// StatusFile is written for kvnet-cni's STATUS verb; "" means
	// cni.DefaultStatusFile, "-" disables it.
	StatusFile string
	// Resync re-applies the state this often even without events, which
	// heals changes made behind kvnet's back (default 1 minute).
	Resync time.Duration
	// MetricsAddr and ProbeAddr: "0" or "" disables.
	MetricsAddr, ProbeAddr string
	// CNIKubeconfig, if set, is where the agent keeps a kubeconfig for
	// kvnet-cni with its own credentials (the DaemonSet's host path).
	CNIKubeconfig string
	// PodScope is which pods the agent watches: PodScopeCluster ("" too),
	// every pod of the cluster, or PodScopeNetworks, its own and those of
	// the networks it serves.
	PodScope string
}

// Agent is kvnet-node.
type Agent struct {
	cfg     Config
	restCfg *rest.Config
	mgr     ctrl.Manager
	dp      *datapath.Datapath
	links   *nl.Handle

	trigger chan struct{} // buffered(1): "something changed"
	// remote is trigger for changes of other nodes' pods, batched: the
	// loop reconciles for them at most every remoteBatch, so that a
	// cluster's churn does not replan this node per event.
	remote chan struct{}
	dhcp   *dhcpServers
	dns    *dnsproxy.Proxy
	// announce watches migration targets' Standby ports for the guest.
	announce *announcements
	// switches follows migration targets to their switch-over, departs
	// migration sources to their guest's last frame (set by Start).
	switches *switchovers
	departs  *departures
	// scope watches the pods of the networks the node serves
	// (PodScopeNetworks; nil: the cache has every pod).
	scope  *podScope
	parsed AnnotationCache                   // owned by the loop
	confs  NetConfCache                      // owned by the loop
	gwMemo map[netconf.NetConf]gatewayResult // owned by the loop: see gateways

	started atomic.Bool   // Start was entered
	stopped chan struct{} // closed when Start has returned, its goroutines joined

	mu            sync.Mutex // guards the fields below
	ready         bool
	last          Plan
	applied       Plan       // the last plan applied without error
	firstApplied  Plan       // the first plan applied without error
	status        cni.Status // last written to StatusFile
	statusWritten bool

	// cniServer answers kvnet-cni's ADD on the socket next to StatusFile.
	cniServer cni.NodeServer
}

// New builds an agent; nothing changes on the node until Start.
func New(restCfg *rest.Config, cfg Config) (*Agent, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("kvnet-node: node name is required (--node-name or $NODE_NAME)")
	}
	if cfg.Resync == 0 {
		cfg.Resync = time.Minute
	}
	if cfg.StatusFile == "" {
		cfg.StatusFile = cni.DefaultStatusFile
	}
	if cfg.Datapath.Name == "" {
		cfg.Datapath.Name = cfg.NodeName
	}
	for _, addr := range []*string{&cfg.MetricsAddr, &cfg.ProbeAddr} {
		if *addr == "" {
			*addr = "0"
		}
	}
	scheme, err := newScheme()
	if err != nil {
		return nil, err
	}
	podCache := cache.ByObject{Transform: trimPod}
	switch cfg.PodScope {
	case "", PodScopeCluster:
		cfg.PodScope = PodScopeCluster
	case PodScopeNetworks:
		// The manager's cache: this node's pods; the networks' pods are
		// watched by the podScope.
		podCache.Field = ownPodsSelector(cfg.NodeName)
	default:
		return nil, fmt.Errorf("kvnet-node: %w", CheckPodScope(cfg.PodScope))
	}
	restCfg = rest.CopyConfig(restCfg)
	if restCfg.QPS == 0 {
		restCfg.QPS, restCfg.Burst = 20, 40
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: cfg.MetricsAddr},
		HealthProbeBindAddress: cfg.ProbeAddr,
		Cache:                  cacheOptions(podCache, cfg.ClusterDNS),
	})
	if err != nil {
		return nil, fmt.Errorf("kvnet-node: create manager: %w", err)
	}
	dp, err := datapath.New(cfg.Datapath)
	if err != nil {
		return nil, fmt.Errorf("kvnet-node: %w", err)
	}
	a := &Agent{cfg: cfg, restCfg: restCfg, mgr: mgr, dp: dp, trigger: make(chan struct{}, 1), remote: make(chan struct{}, 1), stopped: make(chan struct{})}
	if cfg.PodScope == PodScopeNetworks {
		cs, err := kubernetes.NewForConfig(restCfg)
		if err != nil {
			return nil, fmt.Errorf("kvnet-node: watch pods by network: %w", err)
		}
		a.scope = newPodScope(cfg.NodeName, cs, a.kick)
	}
	a.cniServer.Lookup = a.cachedPod
	a.cniServer.Observe = func(outcome string, d time.Duration) {
		cniLookupSeconds.WithLabelValues(cfg.NodeName, outcome).Observe(d.Seconds())
	}
	a.dhcp = newDHCPServers(cfg.Datapath)
	a.dns = dnsproxy.New(dnsproxy.Config{NetNS: cfg.Datapath.NetNS, Observe: func(outcome string, rewritten int) {
		dnsQueries.WithLabelValues(cfg.NodeName, outcome).Inc()
		if rewritten > 0 {
			dnsRewritten.WithLabelValues(cfg.NodeName).Add(float64(rewritten))
		}
	}})
	a.announce = newAnnouncements(cfg.Datapath.NetNS, a.dp.Activate, a.kick, ctrl.Log.WithName("kvnet-node").WithValues("node", cfg.NodeName))
	nsPath := cfg.Datapath.NetNS
	if a.links, err = nl.NewHandle(nsPath); err != nil {
		_ = dp.Close()
		return nil, fmt.Errorf("kvnet-node: %w", err)
	}
	if err := mgr.Add(a); err != nil {
		return nil, err
	}
	if cfg.ProbeAddr != "0" {
		if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
			return nil, err
		}
		if err := mgr.AddReadyzCheck("datapath-applied", func(*http.Request) error {
			if !a.Ready() {
				return errors.New("datapath not applied yet")
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// Run starts the agent and blocks until ctx ends and the agent's loop and
// its goroutines have returned. It leaves the datapath in place on exit:
// pods keep their network while the agent restarts.
func (a *Agent) Run(ctx context.Context) error {
	defer a.links.Close()
	defer a.dp.Close()
	err := a.mgr.Start(ctx)
	if a.started.Load() {
		// The manager stops waiting for its runnables after its
		// graceful-shutdown timeout; the datapath and the link handle
		// must outlive the loop that uses them.
		<-a.stopped
	}
	return err
}

// Ready reports whether the agent has applied a state since it started.
func (a *Agent) Ready() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ready
}

// LastPlan returns the plan last applied (for tests and the lab).
func (a *Agent) LastPlan() Plan {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last
}

// FirstApplied returns the first plan applied without error since the
// agent started (for tests): what the node had once it was ready.
func (a *Agent) FirstApplied() Plan {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.firstApplied
}

// LastApplied returns the plan last applied without error (for tests): its
// rules are programmed and the connections its policies no longer allow
// are cut. A plan whose Apply failed is retried and not returned.
func (a *Agent) LastApplied() Plan {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.applied
}

// WatchedNetworks returns the networks whose pods the agent watches by
// their label (PodScopeNetworks; nil otherwise), sorted.
func (a *Agent) WatchedNetworks() []string {
	if a.scope == nil {
		return nil
	}
	return a.scope.networks()
}

// MTU is the pod MTU of the node's datapath.
func (a *Agent) MTU() int { return a.dp.MTU() }

// NeedLeaderElection: every node runs its own agent.
func (a *Agent) NeedLeaderElection() bool { return false }

// Start is the agent's loop (a manager runnable). It returns only once
// the goroutines it started have returned. The manager calls it once.
func (a *Agent) Start(ctx context.Context) error {
	a.started.Store(true)
	defer close(a.stopped)
	// Whatever makes Start return stops its goroutines (cancel), and Start
	// waits for them (bg.Wait, deferred first so that it runs last).
	var bg sync.WaitGroup
	defer bg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	logger := log.FromContext(ctx).WithName("kvnet-node").WithValues("node", a.cfg.NodeName)
	ctx = log.IntoContext(ctx, logger)
	a.dhcp.report = newDeclineReporter(ctx, a.mgr.GetClient(), a.mgr.GetEventRecorder("kvnet-node"), a.cfg.NodeName)
	a.switches = newSwitchovers(a.cfg.NodeName, newSwitchoverReporter(ctx, a.mgr.GetClient(), a.mgr.GetEventRecorder("kvnet-node")))
	a.announce.opened = a.switches.firstFrame
	a.switches.probes = a.announce.probesSent
	a.switches.lastFrame = a.lastFrameOf(ctx)
	a.switches.arrived = newArrivalPublisher(ctx, a.mgr.GetClient())
	a.departs = newDepartures(a.cfg.NodeName, a.cfg.Datapath.NetNS, logger, newLastFramePublisher(ctx, a.mgr.GetClient(), a.mgr.GetAPIReader()))
	defer a.departs.close()
	a.writeStatus(ctx, false, nil, nil)
	defer a.writeStatus(context.WithoutCancel(ctx), false, nil, nil)
	defer a.dhcp.stopAll()
	defer a.announce.close()
	defer a.dns.Close()
	defer a.directDNS(ctx)

	if a.cfg.CNIKubeconfig != "" {
		bg.Go(func() { keepCNIKubeconfig(ctx, a.cfg.CNIKubeconfig, a.restCfg) })
	}
	if err := a.publishNode(ctx); err != nil {
		return err
	}
	if err := a.watch(ctx); err != nil {
		return err
	}
	if a.scope != nil {
		defer a.scope.stopAll()
	}
	if !a.mgr.GetCache().WaitForCacheSync(ctx) {
		return errors.New("kvnet-node: caches did not sync")
	}
	if err := a.watchLinks(ctx, &bg); err != nil {
		return err
	}
	if a.cfg.StatusFile != "-" {
		// Served once the caches have synced: until then kvnet-cni finds
		// no socket and reads the API server.
		sock := filepath.Join(filepath.Dir(a.cfg.StatusFile), cni.SocketName)
		bg.Go(func() {
			if err := a.cniServer.Serve(ctx, sock); err != nil {
				logger.Error(err, "serve kvnet-cni's socket; kvnet-cni reads the API server instead", "path", sock)
			}
		})
	}
	logger.Info("kvnet-node started", "underlayIP", a.cfg.Datapath.UnderlayIP.String(), "underlayDev", a.cfg.Datapath.UnderlayDev, "mtu", a.dp.MTU(), "podScope", a.cfg.PodScope)

	resync := time.NewTicker(a.cfg.Resync)
	defer resync.Stop()
	var retry, batch <-chan time.Time
	backoff := 250 * time.Millisecond
	waitPoll := waitingPollFirst
	a.kick()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-a.remote:
			if batch == nil {
				batch = time.After(remoteBatch)
			}
			continue
		case <-a.trigger:
		case <-resync.C:
		case <-retry:
		case <-batch:
		}
		// This reconcile reads every change so far, remote ones too.
		retry, batch = nil, nil
		waiting, err := a.reconcile(ctx)
		switch {
		case err == nil:
			backoff = 250 * time.Millisecond
			// A port whose host end has no alias yet: kvnet-cni labels it
			// while it is down, which the kernel announces to no one (a
			// down link's alias change sends no RTM_NEWLINK), so look
			// again soon instead of at the next unrelated event.
			if waiting > 0 {
				retry = time.After(waitPoll)
				waitPoll = min(2*waitPoll, waitingPollMax)
			} else {
				waitPoll = waitingPollFirst
			}
		case ctx.Err() != nil:
			return nil
		default:
			// A port whose interface vanished between listing and
			// applying is retried at once; anything else backs off.
			if !errors.Is(err, datapath.ErrPortNotFound) {
				logger.Error(err, "apply datapath state; retrying", "in", backoff.String())
				applyErrors.WithLabelValues(a.cfg.NodeName).Inc()
			}
			retry = time.After(backoff)
			backoff = min(2*backoff, 30*time.Second)
		}
	}
}

// How soon the loop looks again while local attachments wait for their
// host interface (Plan.Waiting): first, then doubling up to the longest
// (variables for tests).
var (
	waitingPollFirst = 50 * time.Millisecond
	waitingPollMax   = 5 * time.Second
)

// kick asks the loop for a reconcile; events arriving during one coalesce
// into the next.
func (a *Agent) kick() {
	select {
	case a.trigger <- struct{}{}:
	default:
	}
}

// remoteBatch is how long a change of another node's pod may wait for
// the reconcile that reads it, with every other such change meanwhile
// (a variable for tests).
var remoteBatch = 100 * time.Millisecond

// kickRemote asks for a reconcile within remoteBatch.
func (a *Agent) kickRemote() {
	select {
	case a.remote <- struct{}{}:
	default:
	}
}

// cachedPod reads a pod from the cache for kvnet-cni's socket.
func (a *Agent) cachedPod(ctx context.Context, namespace, name string) (cni.PodState, bool, error) {
	var pod corev1.Pod
	err := a.mgr.GetCache().Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &pod)
	switch {
	case apierrors.IsNotFound(err):
		return cni.PodState{}, false, nil
	case err != nil:
		return cni.PodState{}, false, err
	}
	return cni.PodState{UID: string(pod.UID), Networks: pod.Annotations[podnetworks.Annotation]}, true, nil
}

// onNode reports whether obj is a pod on this node (a pod event of its
// own); anything else is not.
func (a *Agent) onNode(obj any) bool {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*corev1.Pod)
	return ok && p.Spec.NodeName == a.cfg.NodeName
}

// publishNode writes on this node's Node its underlay address, so that
// the other nodes can reach the pods here, and the kernel features it
// lacks (physnet.MissingKernelFeaturesAnnotation; removed when none is missing).
func (a *Agent) publishNode(ctx context.Context) error {
	c := a.mgr.GetClient()
	want := map[string]string{VTEPAnnotation: a.cfg.Datapath.UnderlayIP.String()}
	switch ok, err := datapath.ProbeVLAN(a.cfg.Datapath.NetNS); {
	case err != nil:
		// Unknown: say nothing rather than something false.
		log.FromContext(ctx).Error(err, "cannot tell whether the kernel has 802.1Q VLAN links")
	case ok:
		want[physnet.MissingKernelFeaturesAnnotation] = ""
	default:
		want[physnet.MissingKernelFeaturesAnnotation] = physnet.KernelFeatureVLAN
		log.FromContext(ctx).Info("the kernel cannot make 802.1Q VLAN links: localnet networks with a VLAN are not attached on this node", "missing", physnet.KernelFeatureVLAN)
	}
	for {
		var node corev1.Node
		err := a.mgr.GetAPIReader().Get(ctx, types.NamespacedName{Name: a.cfg.NodeName}, &node)
		if err == nil {
			patch := client.MergeFrom(node.DeepCopy())
			changed := false
			for k, v := range want {
				have, ok := node.Annotations[k]
				switch {
				case v == "" && ok:
					delete(node.Annotations, k)
				case v != "" && have != v:
					if node.Annotations == nil {
						node.Annotations = map[string]string{}
					}
					node.Annotations[k] = v
				default:
					continue
				}
				changed = true
			}
			if !changed {
				return nil
			}
			if err = c.Patch(ctx, &node, patch); err == nil {
				log.FromContext(ctx).Info("published the node's VTEP and kernel features", "vtep", want[VTEPAnnotation], "missingKernelFeatures", want[physnet.MissingKernelFeaturesAnnotation])
				return nil
			}
		}
		if apierrors.IsNotFound(err) {
			err = fmt.Errorf("node %q not found", a.cfg.NodeName)
		}
		log.FromContext(ctx).Error(err, "cannot publish the node's VTEP and kernel features; retrying")
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(2 * time.Second):
		}
	}
}

// watch kicks the loop on every change of the objects Desired reads.
func (a *Agent) watch(ctx context.Context) error {
	objs := []client.Object{&corev1.Pod{}, &nadv1.NetworkAttachmentDefinition{}, &corev1.Node{}, &corev1.Service{}, &discoveryv1.EndpointSlice{},
		&networkingv1.NetworkPolicy{}, &corev1.Namespace{}}
	if a.hasServiceCIDRs(ctx) {
		objs = append(objs, &networkingv1.ServiceCIDR{})
	}
	// MultiNetworkPolicy is optional too (kvnet install adds its CRD):
	// without it there is none to enforce.
	if _, err := a.mgr.GetRESTMapper().RESTMapping(mnpv1beta1.GroupVersion.WithKind("MultiNetworkPolicy").GroupKind(), "v1beta1"); err == nil {
		objs = append(objs, &mnpv1beta1.MultiNetworkPolicy{})
	} else if !meta.IsNoMatchError(err) {
		return err
	} else {
		log.FromContext(ctx).Info("the MultiNetworkPolicy CRD is not installed: MultiNetworkPolicies are not enforced")
	}
	// KubeVirt is optional: without its CRDs there are no VMIs to watch.
	if _, err := a.mgr.GetRESTMapper().RESTMapping(kubevirtv1.GroupVersion.WithKind("VirtualMachineInstance").GroupKind(), "v1"); err == nil {
		objs = append(objs, &kubevirtv1.VirtualMachineInstance{})
	} else if !meta.IsNoMatchError(err) {
		return err
	} else {
		log.FromContext(ctx).Info("KubeVirt is not installed: VMIs are not watched")
	}
	h := toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { a.kick() },
		UpdateFunc: func(oldObj, newObj any) {
			// The caches hold trimmed pods, nodes and namespaces: an
			// update of what the plan does not read (a pod's
			// conditions, a node's heartbeat) leaves them equal.
			if !sameButVersion(oldObj, newObj) {
				a.kick()
			}
		},
		DeleteFunc: func(any) { a.kick() },
	}
	// Pods: this node's at once, other nodes' batched (kickRemote).
	pods := toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { a.podChanged(o, nil) },
		UpdateFunc: func(oldObj, newObj any) {
			if !sameButVersion(oldObj, newObj) {
				a.podChanged(newObj, oldObj)
			}
		},
		DeleteFunc: func(o any) { a.podChanged(o, nil) },
	}
	if a.scope != nil {
		a.scope.handler = pods
	}
	for _, o := range objs {
		inf, err := a.mgr.GetCache().GetInformer(ctx, o)
		if err != nil {
			return fmt.Errorf("kvnet-node: watch %T: %w", o, err)
		}
		handler := h
		if _, ok := o.(*corev1.Pod); ok {
			handler = pods
		}
		if _, err := inf.AddEventHandler(handler); err != nil {
			return err
		}
	}
	return nil
}

// podChanged kicks the loop for a pod event: at once for a pod of this
// node (before or after the change), batched for another node's.
func (a *Agent) podChanged(obj, old any) {
	if m, err := meta.Accessor(obj); err == nil {
		a.cniServer.PodChanged(m.GetNamespace(), m.GetName())
	} else if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		if ns, name, err := toolscache.SplitMetaNamespaceKey(d.Key); err == nil {
			a.cniServer.PodChanged(ns, name)
		}
	}
	if a.onNode(obj) || (old != nil && a.onNode(old)) {
		a.kick()
		return
	}
	a.kickRemote()
}

// watchLinks kicks the loop when a link appears, goes or changes in the
// node namespace: kvnet-cni makes pod ports there after the pod's
// allocation is known, so this is how a new port gets attached at once. A
// failed subscription is renewed (the resync covers the gap). The
// goroutine following the updates is added to bg and returns when ctx
// ends.
func (a *Agent) watchLinks(ctx context.Context, bg *sync.WaitGroup) error {
	subscribe := func() (<-chan netlink.LinkUpdate, error) {
		nsh, err := nl.OpenNS(a.cfg.Datapath.NetNS)
		if err != nil {
			return nil, err
		}
		defer nsh.Close()
		updates := make(chan netlink.LinkUpdate, 64)
		err = netlink.LinkSubscribeWithOptions(updates, ctx.Done(), netlink.LinkSubscribeOptions{
			Namespace: &nsh,
			ErrorCallback: func(err error) {
				if ctx.Err() == nil {
					log.FromContext(ctx).Error(err, "link updates; subscribing again")
				}
			},
		})
		if err != nil {
			return nil, fmt.Errorf("kvnet-node: subscribe to link updates: %w", err)
		}
		return updates, nil
	}
	updates, err := subscribe()
	if err != nil {
		return err
	}
	bg.Go(func() { a.followLinks(ctx, updates, subscribe) })
	return nil
}

// Retry delays of followLinks' subscriptions: the first, and the longest
// (variables for tests).
var (
	linkResubscribeFirst = 100 * time.Millisecond
	linkResubscribeMax   = 30 * time.Second
)

// followLinks kicks the loop for each update of a kvnet link (pod ports:
// alias portalias.Prefix… or name "kvp…") until ctx ends. The netlink library
// closes updates when ctx ends or the subscription fails; then, while ctx
// lives, it subscribes again, retrying with a backoff that stops at once
// when ctx ends, and kicks the loop for whatever happened meanwhile.
func (a *Agent) followLinks(ctx context.Context, updates <-chan netlink.LinkUpdate, subscribe func() (<-chan netlink.LinkUpdate, error)) {
	for {
		for u := range updates {
			if portalias.Has(u.Attrs().Alias) || strings.HasPrefix(u.Attrs().Name, "kvp") {
				a.kick()
			}
		}
		for delay := linkResubscribeFirst; ; delay = min(2*delay, linkResubscribeMax) {
			if ctx.Err() != nil {
				return
			}
			var err error
			if updates, err = subscribe(); err == nil {
				break
			}
			log.FromContext(ctx).Error(err, "link updates; subscribing again", "in", delay.String())
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
		}
		a.kick() // whatever happened meanwhile
	}
}

// reconcile computes the plan from the caches and the node's links and
// applies it.
func (a *Agent) reconcile(ctx context.Context) (waiting int, err error) {
	start := time.Now()
	in, err := a.input(ctx)
	if err != nil {
		return 0, err
	}
	a.markPrimaryDefault(ctx, in.Pods)
	plan := Desired(in)
	planSeconds.WithLabelValues(a.cfg.NodeName).Observe(time.Since(start).Seconds())
	if a.scope != nil {
		a.scope.sync(ctx, plan.PodNetworks)
		// A network whose pods are not listed yet would lose its
		// other nodes' pods from the datapath (after a restart, every
		// network): hold the apply until its watch has synced (which
		// kicks the loop), for scopeSyncWait at most.
		if waiting, overdue := a.scope.unsynced(time.Now()); len(waiting) > 0 {
			log.FromContext(ctx).V(1).Info("holding the apply until the pods of these networks are listed", "networks", waiting)
			return 1, nil // looked at again soon, as a port waiting for its link
		} else if len(overdue) > 0 {
			log.FromContext(ctx).Error(errors.New("watch not synced"), "applying without these networks' pods on other nodes: their watch has not listed them", "networks", overdue, "after", scopeSyncWait.String())
		}
	}
	// The proxy listens before its networks' queries are sent to it; a
	// network it cannot serve keeps sending them to the cluster DNS.
	served, err := a.dns.Sync(ctx, plan.DNS)
	if err != nil {
		log.FromContext(ctx).Error(err, "DNS proxy: some networks query the cluster DNS directly (answers unrewritten)")
	}
	plan.State = withDirectDNS(plan.State, plan.DNS, func(name string) bool { return !served[name] })
	applyErr := a.dp.Apply(ctx, plan.State)
	if a.switches != nil {
		a.switches.sync(plan.MigrationTargets, plan.State.Ports)
	}
	a.announce.sync(watched(plan), plan.Neighbours, plan.ProbeFrom)
	if a.departs != nil {
		a.departs.sync(plan.MigrationSources, plan.DepartedSources, plan.ProbeFrom)
	}
	a.dhcp.sync(ctx, plan.DHCP)
	ok := applyErr == nil || isOnly(applyErr, datapath.ErrPortNotFound)
	a.writeStatus(ctx, ok, plan.Exhausted, plan.Unserved)
	applySeconds.WithLabelValues(a.cfg.NodeName).Observe(time.Since(start).Seconds())
	rulesSyncSeconds.WithLabelValues(a.cfg.NodeName).Observe(a.dp.RulesSyncDuration().Seconds())
	a.report(ctx, plan, ok)
	return plan.Waiting, applyErr
}

// directDNS, as the agent stops, sends the DNS queries of the networks
// the proxy served to the cluster DNS again (answers unrewritten), so
// that names resolve while no kvnet-node runs here; the next agent sends
// them to its proxy once it listens. A crash skips this: DNS of the
// node's primary networks then waits for the restart.
func (a *Agent) directDNS(ctx context.Context) {
	last := a.LastApplied()
	if len(last.DNS) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := a.dp.Apply(ctx, withDirectDNS(last.State, last.DNS, nil)); err != nil {
		log.FromContext(ctx).Error(err, "DNS proxy: send queries to the cluster DNS directly before stopping")
		return
	}
	log.FromContext(ctx).Info("DNS proxy stopping: primary networks query the cluster DNS directly", "networks", len(last.DNS))
}

// lastFrameOf returns the guest's last frame on a network as the
// source launcher pod's migration.LastFramesAnnotation has it, from the
// cache.
func (a *Agent) lastFrameOf(ctx context.Context) func(types.NamespacedName, string) (migration.LastFrame, bool) {
	return func(key types.NamespacedName, network string) (migration.LastFrame, bool) {
		var pod corev1.Pod
		if err := a.mgr.GetCache().Get(ctx, key, &pod); err != nil {
			// Under PodScopeNetworks a source pod on another node is
			// the podScope's.
			p, ok := a.scopedPod(key)
			if !ok {
				return migration.LastFrame{}, false
			}
			pod = *p
		}
		v, ok := pod.Annotations[migration.LastFramesAnnotation]
		if !ok {
			return migration.LastFrame{}, false
		}
		frames, err := migration.ParseLastFrames(v)
		if err != nil {
			log.FromContext(ctx).Error(err, "source pod's last frames unreadable", "pod", key.String())
			return migration.LastFrame{}, false
		}
		f, ok := frames[network]
		return f, ok
	}
}

// scopedPod returns a pod of a network the podScope watches, if any.
func (a *Agent) scopedPod(key types.NamespacedName) (*corev1.Pod, bool) {
	if a.scope == nil {
		return nil, false
	}
	return a.scope.get(key)
}

// watched is the plan's ports as the announcements take them: only a
// migration target's Standby port waits for its guest's first frame; any
// other Standby port (a departed migration source's) stays closed.
func watched(plan Plan) []datapath.Port {
	targets := map[string]bool{}
	for _, t := range plan.MigrationTargets {
		targets[switchKey(t.Network, t.MAC.String())] = true
	}
	out := slices.Clone(plan.State.Ports)
	for i, p := range out {
		if p.Standby && !targets[switchKey(p.Network, p.MAC.String())] {
			out[i].Standby = false
		}
	}
	return out
}

// input gathers Desired's input.
func (a *Agent) input(ctx context.Context) (Input, error) {
	c := a.mgr.GetCache()
	in := Input{Node: a.cfg.NodeName, MTU: a.dp.MTU(), DNS: a.cfg.DNS, Gateways: a.gateways, Annotations: &a.parsed, NetConfs: &a.confs, Reserved: a.cfg.Reserved,
		VMINodes: map[types.NamespacedName]string{}, Migrations: map[types.NamespacedName]*migration.Migration{},
		LauncherDHCPv4: map[types.NamespacedName]bool{}, Announced: a.announce.Announced()}
	// The cache's objects, not copies (a plan at 1,000 nodes and networks
	// spent most of its time copying them): Desired and the agent only
	// read them (TestDesiredLeavesItsInputUnchanged).
	noCopy := client.UnsafeDisableDeepCopy
	var nads nadv1.NetworkAttachmentDefinitionList
	if err := c.List(ctx, &nads, noCopy); err != nil {
		return in, err
	}
	in.NADs = nads.Items
	var pods corev1.PodList
	if err := c.List(ctx, &pods, noCopy); err != nil {
		return in, err
	}
	in.Pods = pods.Items
	if a.scope != nil {
		in.Pods = a.scope.pods(in.Pods)
	}
	for _, pod := range in.Pods {
		if _, ok := pod.Annotations[migration.GuestArrivedAnnotation]; ok {
			if in.GuestArrived == nil {
				in.GuestArrived = map[types.NamespacedName]bool{}
			}
			in.GuestArrived[types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}] = true
		}
	}
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes, noCopy); err != nil {
		return in, err
	}
	in.Nodes = nodes.Items
	var services corev1.ServiceList
	if err := c.List(ctx, &services, noCopy); err != nil {
		return in, err
	}
	// Oldest first: a node port or external address two Services claim
	// goes to the older, whatever order the cache lists them in.
	slices.SortStableFunc(services.Items, func(a, b corev1.Service) int {
		return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	in.Services = services.Items
	var eps discoveryv1.EndpointSliceList
	if err := c.List(ctx, &eps, noCopy); err != nil {
		return in, err
	}
	in.EndpointSlices = eps.Items
	var nps networkingv1.NetworkPolicyList
	if err := c.List(ctx, &nps, noCopy); err != nil {
		return in, err
	}
	in.NetworkPolicies = nps.Items
	var namespaces corev1.NamespaceList
	if err := c.List(ctx, &namespaces, noCopy); err != nil {
		return in, err
	}
	in.Namespaces = namespaces.Items
	in.ClusterDNS, in.ClusterDomain = a.cfg.ClusterDNS, a.cfg.ClusterDomain
	in.DNSProxyPort = a.cfg.DNSProxyPort
	in.ServiceCIDRs = a.cfg.ServiceCIDRs
	in.DefaultNetworkCIDRs = a.cfg.DefaultNetworkCIDRs
	if a.hasServiceCIDRs(ctx) {
		var cidrs networkingv1.ServiceCIDRList
		if err := c.List(ctx, &cidrs, noCopy); err != nil {
			return in, err
		}
		in.ServiceCIDRs = append(slices.Clip(in.ServiceCIDRs), ServiceCIDRsOf(cidrs.Items)...)
	}
	var mnps mnpv1beta1.MultiNetworkPolicyList
	if err := c.List(ctx, &mnps, noCopy); err == nil {
		in.MultiNetworkPolicies = mnps.Items
	} else if !meta.IsNoMatchError(err) && !errors.As(err, new(*cache.ErrResourceNotCached)) {
		return in, err
	}
	var vmis kubevirtv1.VirtualMachineInstanceList
	if err := c.List(ctx, &vmis, noCopy); err == nil {
		for _, vmi := range vmis.Items {
			key := types.NamespacedName{Namespace: vmi.Namespace, Name: vmi.Name}
			in.VMINodes[key] = vmi.Status.NodeName
			if launcherServesDHCPv4(&vmi) {
				in.LauncherDHCPv4[key] = true
			}
			if m := migration.Of(&vmi); m != nil {
				in.Migrations[key] = m
			}
		}
	} else if !meta.IsNoMatchError(err) && !errors.As(err, new(*cache.ErrResourceNotCached)) {
		return in, err
	}
	links, err := a.links.LinkList()
	if err != nil {
		return in, err
	}
	in.Links = map[string]string{}
	in.Bridges = map[string]bool{}
	newest := map[string]int{} // alias -> ifindex of the link kept
	for _, l := range links {
		attrs := l.Attrs()
		if l.Type() == "bridge" {
			in.Bridges[attrs.Name] = true
		}
		if _, err := portalias.Parse(attrs.Alias); err != nil {
			continue // not a pod port of kvnet-cni's
		}
		// Two links with one alias: a pod recreated under the same name
		// before the old sandbox's DEL; the newer link is the pod's.
		if attrs.Index > newest[attrs.Alias] {
			newest[attrs.Alias] = attrs.Index
			in.Links[attrs.Alias] = attrs.Name
		}
	}
	return in, nil
}

// gateways memoises GatewaysOf per configuration: building an allocator
// for a large subnet on every reconcile would be wasteful. Only the loop
// goroutine calls it.
func (a *Agent) gateways(conf *netconf.NetConf) ([]netip.Addr, error) {
	key := *conf // comparable: every field a string, number or bool
	if g, ok := a.gwMemo[key]; ok {
		return g.addrs, g.err
	}
	addrs, err := GatewaysOf(conf)
	if a.gwMemo == nil || len(a.gwMemo) > 4096 {
		a.gwMemo = map[netconf.NetConf]gatewayResult{}
	}
	a.gwMemo[key] = gatewayResult{addrs, err}
	return addrs, err
}

type gatewayResult struct {
	addrs []netip.Addr
	err   error
}

// report updates metrics and logs what changed since the last plan.
func (a *Agent) report(ctx context.Context, plan Plan, ok bool) {
	logger := log.FromContext(ctx)
	a.mu.Lock()
	prev, wasReady := a.last, a.ready
	a.last = plan
	if ok {
		a.applied = plan
		if !wasReady {
			a.firstApplied = plan
		}
	}
	a.ready = a.ready || ok
	a.mu.Unlock()
	if ok && !wasReady {
		logger.Info("datapath applied; node ready", "networks", len(plan.State.Networks), "ports", len(plan.State.Ports), "remoteMACs", len(plan.State.RemoteMACs))
	}
	if !slices.Equal(plan.Problems, prev.Problems) {
		for _, p := range plan.Problems {
			logger.Info("input skipped", "problem", p)
		}
	}
	node := a.cfg.NodeName
	netNames := map[string]bool{}
	for _, n := range plan.State.Networks {
		netNames[n.Name] = true
	}
	for _, n := range prev.State.Networks {
		if !netNames[n.Name] {
			logger.Info("network removed from the node", "network", n.Name, "id", n.ID)
			for _, g := range []*gaugeVec{portsGauge, remoteMACsGauge, remoteNodesGauge, leasesGauge, policyPortsGauge, policiesGauge} {
				g.DeleteLabelValues(node, n.Name)
			}
		}
	}
	prevNames := map[string]bool{}
	for _, n := range prev.State.Networks {
		prevNames[n.Name] = true
	}
	for _, n := range plan.State.Networks {
		if !prevNames[n.Name] {
			logger.Info("network added to the node", "network", n.Name, "id", n.ID, "primary", n.Primary)
		}
		ports, macs := 0, 0
		for _, p := range plan.State.Ports {
			if p.Network == n.Name {
				ports++
			}
		}
		for _, m := range plan.State.RemoteMACs {
			if m.Network == n.Name {
				macs++
			}
		}
		portsGauge.WithLabelValues(node, n.Name).Set(float64(ports))
		remoteMACsGauge.WithLabelValues(node, n.Name).Set(float64(macs))
		remoteNodesGauge.WithLabelValues(node, n.Name).Set(float64(len(n.Remotes)))
	}
	for _, d := range plan.DHCP {
		leasesGauge.WithLabelValues(node, d.Network).Set(float64(len(d.Leases)))
	}
	policyPorts, policies := policyCounts(plan.State)
	for _, n := range plan.State.Networks {
		policyPortsGauge.WithLabelValues(node, n.Name).Set(float64(policyPorts[n.Name]))
		policiesGauge.WithLabelValues(node, n.Name).Set(float64(len(policies[n.Name])))
	}
	waitingGauge.WithLabelValues(node).Set(float64(plan.Waiting))
	readyGauge.WithLabelValues(node).Set(boolFloat(a.Ready()))
	logger.V(1).Info("datapath applied", "networks", len(plan.State.Networks), "ports", len(plan.State.Ports), "remoteMACs", len(plan.State.RemoteMACs), "waiting", plan.Waiting)
}

// isOnly reports whether every error joined in err matches target.
func isOnly(err, target error) bool {
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		for _, e := range joined.Unwrap() {
			if !isOnly(e, target) {
				return false
			}
		}
		return true
	}
	if w := errors.Unwrap(err); w != nil && !errors.Is(err, target) {
		return isOnly(w, target)
	}
	return errors.Is(err, target)
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// clusterSliceSelector selects the EndpointSlices of the cluster DNS
// Service dns (default: DefaultClusterDNS) and of the API server.
func clusterSliceSelector(dns types.NamespacedName) labels.Selector {
	if dns.Name == "" {
		dns = DefaultClusterDNS
	}
	req, err := labels.NewRequirement(discoveryv1.LabelServiceName, selection.In, ClusterServiceNames(dns))
	if err != nil { // a name that is no label value: no slices at all
		return labels.Nothing()
	}
	return labels.NewSelector().Add(*req)
}

// cacheOptions are the options of kvnet-node's informer cache: pods as
// podCache says, every kind trimmed to what Desired reads.
func cacheOptions(podCache cache.ByObject, clusterDNS types.NamespacedName) cache.Options {
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		// Every pod of the cluster is cached (remote pods are FDB
		// entries) unless PodScope says otherwise, so keep only what
		// Desired reads.
		&corev1.Pod{}:  podCache,
		&corev1.Node{}: {Transform: trimNode},
		// Namespaces: their labels, for policies' namespace selectors.
		&corev1.Namespace{}: {Transform: trimNamespace},
		// Only the cluster DNS's and the API server's slices.
		&discoveryv1.EndpointSlice{}: {Label: clusterSliceSelector(clusterDNS)},
	},
		// The rest: VMIs trimmed, no managed fields on any. (A ByObject
		// entry for VMIs would need KubeVirt's CRD at start.)
		DefaultTransform: trimOther,
	}
}

// hasServiceCIDRs reports whether the API server serves ServiceCIDR
// objects (networking.k8s.io/v1, Kubernetes 1.33 and later).
func (a *Agent) hasServiceCIDRs(ctx context.Context) bool {
	_, err := a.mgr.GetRESTMapper().RESTMapping(networkingv1.SchemeGroupVersion.WithKind("ServiceCIDR").GroupKind(), "v1")
	if err != nil && !meta.IsNoMatchError(err) {
		log.FromContext(ctx).Error(err, "cannot tell whether the API server has ServiceCIDRs")
	}
	return err == nil
}
