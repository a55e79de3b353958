package simkubelet

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/lab/simnet"
	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/podnetworks"
)

// Config configures the simulated kubelet of one node.
type Config struct {
	// NodeName is the node: pods with spec.nodeName == NodeName are run.
	NodeName string
	// NodeNetNS is the name of the node's network namespace under
	// /run/netns (its path there is accepted too, as simnet.Node.NS has
	// it); CNI plugins run inside it (`ip netns exec`).
	NodeNetNS string
	// RESTConfig reaches the API server. Run watches the node's pods with
	// an informer (field selector spec.nodeName) and reads namespaces and
	// NADs directly (uncached) when it sets a pod up.
	RESTConfig *rest.Config
	// CNIBinDir holds kvnet-cni and any other plugin NADs name.
	CNIBinDir string
	// CNICacheDir is libcni's cache (results and configurations of ADDs,
	// used for DEL). It must belong to this node alone: on start, cached
	// attachments of pods not on the node are deleted.
	CNICacheDir string
	// Env is extra environment for plugins, e.g. KVNET_KUBECONFIG=<path>.
	Env []string
	// PodNetNSPrefix prefixes pod namespace names under /run/netns. It must
	// belong to this node alone (e.g. "<cluster>-<node>-pod-"): on start,
	// namespaces with the prefix that belong to no pod of the node are
	// deleted.
	PodNetNSPrefix string
	// LoopbackForwards are TCP addresses on the loopback ("127.0.0.1:6443")
	// of the caller's namespace that plugins must reach from inside the
	// node namespace, typically the API server of the kubeconfig in Env
	// when a local control plane serves it on 127.0.0.1 (the node's own
	// loopback is another one). Run listens on each address inside the
	// node namespace and relays connections to the same address outside.
	LoopbackForwards []string
	// ClusterDefaultNetwork, when set, is the CNI configuration (a plugin
	// or a list) of the cluster default network, and the kubelet behaves
	// like stock Multus: every pod gets it as eth0, then what its networks
	// annotation selects, nothing else; the pod's IPs are eth0's; and the
	// kubelet writes k8s.v1.cni.cncf.io/network-status as Multus does (the
	// cluster default network's entry marked default). Without it, the
	// primary network is attached as OVN-Kubernetes does (see package doc).
	ClusterDefaultNetwork []byte
	// Workers bounds how many pods are set up or torn down at once
	// (default 8).
	Workers int
	// Runtime runs what a pod's containers would, once its network is up;
	// nil runs nothing (a pod is only its network namespace).
	Runtime Runtime
	// NodeIP is the node's address on the underlay, reported as its
	// InternalIP; unset reports only the Hostname address.
	NodeIP netip.Addr
	// HeartbeatInterval is how often the node's Ready condition and Lease
	// are renewed (default 10s, kubelet's node status update frequency).
	HeartbeatInterval time.Duration
	// Log receives what happens; the zero value discards.
	Log logr.Logger
}

// Runtime stands in for the container runtime of a node: what runs in a
// pod once its network is set up. The lab's virt-launcher stand-in (QEMU
// guests) is one.
type Runtime interface {
	// Start starts pod's containers in its network namespace netns (a
	// path). It is called after every attachment was added and before the
	// pod is reported Running, and again for a Running pod adopted after a
	// restart of the kubelet, whose containers must then be (re)started
	// as needed. An error fails the pod for good: phase Failed, reason
	// ReasonContainerFailed, the error as the message, as kubelet reports
	// a container that cannot run (restartPolicy Never).
	Start(ctx context.Context, pod *corev1.Pod, netns string) error
	// Stop stops the containers of the pod with uid, if any, and waits for
	// them; it is called before the pod's network is torn down.
	Stop(uid types.UID)
}

// ReasonContainerFailed is the reason of a pod that failed because
// Runtime.Start failed.
const ReasonContainerFailed = "ContainerFailed"

// ReasonNetworkSetupFailed is the reason of a pod's Ready=False condition
// when its network could not be set up; the message names the attachment.
const ReasonNetworkSetupFailed = "NetworkSetupFailed"

const (
	defaultWorkers = 8
	retryBase      = 2 * time.Second
	retryMax       = 30 * time.Second
	cniTimeout     = 2 * time.Minute // one CNI call (kvnet-cni ADD waits up to 30 s)
	uidChars       = 12              // hex digits of the UID in namespace names
)

// PodNetNS returns the path of pod's network namespace (which exists while
// the pod runs on the node).
func PodNetNS(cfg Config, pod *corev1.Pod) string {
	return nl.NSPath(nsName(cfg.PodNetNSPrefix, pod.UID))
}

func nsName(prefix string, uid types.UID) string {
	s := strings.ReplaceAll(string(uid), "-", "")
	if len(s) > uidChars {
		s = s[:uidChars]
	}
	return prefix + s
}

func (cfg *Config) check() error {
	var missing []string
	for name, v := range map[string]string{"NodeName": cfg.NodeName, "NodeNetNS": cfg.NodeNetNS, "CNIBinDir": cfg.CNIBinDir,
		"CNICacheDir": cfg.CNICacheDir, "PodNetNSPrefix": cfg.PodNetNSPrefix} {
		if v == "" {
			missing = append(missing, name)
		}
	}
	if cfg.RESTConfig == nil {
		missing = append(missing, "RESTConfig")
	}
	if len(missing) > 0 {
		return fmt.Errorf("simkubelet: Config lacks %s", strings.Join(missing, ", "))
	}
	if name, ok := strings.CutPrefix(cfg.NodeNetNS, nl.NetNSDir+"/"); ok {
		cfg.NodeNetNS = name
	}
	if strings.ContainsRune(cfg.PodNetNSPrefix, '/') || strings.ContainsRune(cfg.NodeNetNS, '/') {
		return fmt.Errorf("simkubelet: NodeNetNS %q and PodNetNSPrefix %q must be names, not paths", cfg.NodeNetNS, cfg.PodNetNSPrefix)
	}
	if !nl.NamedNSExists(cfg.NodeNetNS) {
		return fmt.Errorf("simkubelet: node %s: network namespace %s does not exist", cfg.NodeName, nl.NSPath(cfg.NodeNetNS))
	}
	if st, err := os.Stat(cfg.CNIBinDir); err != nil || !st.IsDir() {
		return fmt.Errorf("simkubelet: CNIBinDir %q is not a directory", cfg.CNIBinDir)
	}
	return nil
}

// kubelet is the running simulated kubelet of one node.
type kubelet struct {
	cfg    Config
	log    logr.Logger
	cs     kubernetes.Interface
	reader client.Reader
	cni    *libcni.CNIConfig
	// clusterDefault is the parsed Config.ClusterDefaultNetwork (Multus
	// mode), or nil.
	clusterDefault *libcni.NetworkConfigList
	bootID         string // NodeInfo.BootID: new on every Run
	store          cache.Store
	queue          workqueue.TypedRateLimitingInterface[string]

	mu   sync.Mutex
	pods map[string]*podState // by "<namespace>/<name>"
}

// podState is what this run did for a pod.
type podState struct {
	uid      types.UID
	ready    bool     // sandbox up: netns and every attachment added
	ips      []string // pod IPs, when ready
	reported bool     // Running written to the pod's status
}

// Run runs the simulated kubelet of cfg.NodeName until ctx is done (it then
// returns nil, leaving pods and namespaces as they are). It returns an
// error only when it cannot start.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.check(); err != nil {
		return err
	}
	if cfg.Workers <= 0 {
		cfg.Workers = defaultWorkers
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		return fmt.Errorf("simkubelet: iproute2's ip is needed to run plugins in the node namespace: %w", err)
	}
	log := cfg.Log.WithValues("node", cfg.NodeName)
	rc := rest.CopyConfig(cfg.RESTConfig)
	rc.UserAgent = "kvnet-simkubelet/" + cfg.NodeName
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("simkubelet: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := nadv1.AddToScheme(scheme); err != nil {
		return err
	}
	reader, err := client.New(rc, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("simkubelet: %w", err)
	}
	var clusterDefault *libcni.NetworkConfigList
	if cfg.ClusterDefaultNetwork != nil {
		if clusterDefault, err = parseConfig(cfg.ClusterDefaultNetwork); err != nil {
			return fmt.Errorf("simkubelet: ClusterDefaultNetwork: %w", err)
		}
	}
	k := &kubelet{
		cfg: cfg, log: log, cs: cs, reader: reader, clusterDefault: clusterDefault,
		cni: libcni.NewCNIConfigWithCacheDir([]string{cfg.CNIBinDir}, cfg.CNICacheDir,
			&nsExec{ip: ip, netns: cfg.NodeNetNS, env: cfg.Env, log: log}),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](retryBase, retryMax),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "simkubelet-" + cfg.NodeName}),
		pods:   map[string]*podState{},
		bootID: string(uuid.NewUUID()),
	}
	// On return: stop everything started below and wait for it.
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		k.queue.ShutDown()
		wg.Wait()
	}()

	for _, addr := range cfg.LoopbackForwards {
		f, err := simnet.Forward(nl.NSPath(cfg.NodeNetNS), addr, addr)
		if err != nil {
			return fmt.Errorf("simkubelet: node %s: %w", cfg.NodeName, err)
		}
		defer f.Close()
	}

	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
	}))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: k.enqueue,
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.Pod)
			n, ok2 := newObj.(*corev1.Pod)
			if !ok1 || !ok2 || relevantChange(o, n) {
				k.enqueue(newObj)
			}
		},
		DeleteFunc: k.enqueue,
	}); err != nil {
		return fmt.Errorf("simkubelet: %w", err)
	}
	k.store = inf.GetStore()
	factory.Start(ctx.Done())
	defer func() {
		cancel()
		factory.Shutdown()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil // ctx done
	}
	k.gc(ctx)
	wg.Go(func() { k.heartbeat(ctx) })
	log.Info("simkubelet running", "netns", cfg.NodeNetNS, "pods", len(k.store.ListKeys()))
	for range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k.next(ctx) {
			}
		}()
	}
	<-ctx.Done()
	return nil
}

// relevantChange reports whether an update can change what the kubelet
// does: status-only updates (its own included) do not.
func relevantChange(o, n *corev1.Pod) bool {
	return o.UID != n.UID ||
		(o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) ||
		podnetworks.Completed(o) != podnetworks.Completed(n) ||
		!maps.Equal(o.Annotations, n.Annotations)
}

func (k *kubelet) enqueue(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		k.log.Error(err, "cannot key pod event")
		return
	}
	k.queue.Add(key)
}

// next processes one queued pod; false once the queue is shut down.
func (k *kubelet) next(ctx context.Context) bool {
	key, quit := k.queue.Get()
	if quit {
		return false
	}
	defer k.queue.Done(key)
	if ctx.Err() != nil {
		return true // stopping: leave everything for the next run
	}
	err := k.sync(ctx, key)
	switch {
	case err == nil:
		k.queue.Forget(key)
	case ctx.Err() != nil:
	default:
		k.log.Error(err, "pod sync failed; retrying", "pod", key, "attempt", k.queue.NumRequeues(key)+1)
		k.queue.AddRateLimited(key)
	}
	return true
}

func (k *kubelet) state(key string) *podState {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.pods[key]
}

func (k *kubelet) setState(key string, st *podState) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if st == nil {
		delete(k.pods, key)
	} else {
		k.pods[key] = st
	}
}

// sync brings one pod to where it should be. The queue runs at most one
// sync per key at a time.
func (k *kubelet) sync(ctx context.Context, key string) error {
	var pod *corev1.Pod
	if obj, exists, err := k.store.GetByKey(key); err != nil {
		return err
	} else if exists {
		pod = obj.(*corev1.Pod)
	}
	st := k.state(key)
	if st != nil && (pod == nil || pod.UID != st.uid) {
		// Gone (force-deleted), or replaced by a pod of the same name.
		k.log.Info("pod gone; tearing down", "pod", key, "uid", st.uid)
		k.teardown(ctx, key, st.uid)
		k.setState(key, nil)
		st = nil
	}
	if pod == nil {
		return nil
	}
	name := nsName(k.cfg.PodNetNSPrefix, pod.UID)
	switch {
	case pod.DeletionTimestamp != nil:
		k.log.Info("pod deleted; tearing down", "pod", key)
		k.teardown(ctx, key, pod.UID)
		k.setState(key, nil)
		return k.confirmDeletion(ctx, pod)
	case podnetworks.Completed(pod):
		if st != nil || nl.NamedNSExists(name) {
			k.log.Info("pod completed; tearing down", "pod", key)
			k.teardown(ctx, key, pod.UID)
			k.setState(key, nil)
		}
		return nil
	}
	if st != nil && st.ready && nl.NamedNSExists(name) {
		if !st.reported {
			return k.reportRunning(ctx, key, pod, st)
		}
		return nil
	}
	if st == nil && nl.NamedNSExists(name) && podReady(pod) {
		// The "runtime" survived a restart of the kubelet.
		k.log.Info("adopting running pod", "pod", key, "netns", nl.NSPath(name))
		k.setState(key, &podState{uid: pod.UID, ready: true, reported: true})
		_, err := k.startContainers(ctx, key, pod, nl.NSPath(name))
		return err
	}
	return k.setup(ctx, key, pod)
}

// setup makes a fresh sandbox for pod and adds every attachment.
func (k *kubelet) setup(ctx context.Context, key string, pod *corev1.Pod) error {
	st := &podState{uid: pod.UID}
	k.setState(key, st)
	atts, err := attachments(ctx, k.reader, pod, k.clusterDefault)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		k.setNotReady(ctx, key, pod, err.Error())
		var perm *permanentError
		if errors.As(err, &perm) {
			k.log.Info("pod cannot start until it changes", "pod", key, "error", err.Error())
			return nil
		}
		return fmt.Errorf("pod %s: %w", key, err)
	}
	// Leftovers of an earlier attempt (or run) go first: every attempt is a
	// new sandbox, as with kubelet.
	k.teardown(ctx, key, pod.UID)
	name := nsName(k.cfg.PodNetNSPrefix, pod.UID)
	path, err := nl.CreateNamedNS(name)
	if err != nil {
		k.setNotReady(ctx, key, pod, err.Error())
		return fmt.Errorf("pod %s: %w", key, err)
	}
	var chosen *current.Result
	var statuses []networkStatus
	for _, a := range atts {
		res, err := k.add(ctx, pod, path, a)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err() // stopping: leave the sandbox to the next run
			}
			err = fmt.Errorf("%s: ADD: %w", a, err)
			k.teardown(ctx, key, pod.UID)
			k.setNotReady(ctx, key, pod, err.Error())
			return fmt.Errorf("pod %s: %w", key, err)
		}
		switch {
		case k.clusterDefault != nil:
			if a.clusterDefault {
				chosen = res
			}
			statuses = append(statuses, statusOf(a, res))
		case a.primary || chosen == nil && len(res.IPs) > 0:
			chosen = res
		}
		k.log.V(1).Info("attachment added", "pod", key, "attachment", a.String())
	}
	if k.clusterDefault != nil {
		if err := k.writeNetworkStatus(ctx, pod, statuses); err != nil {
			k.teardown(ctx, key, pod.UID)
			k.setNotReady(ctx, key, pod, err.Error())
			return fmt.Errorf("pod %s: %w", key, err)
		}
	}
	st.ready, st.ips = true, podIPs(chosen)
	if started, err := k.startContainers(ctx, key, pod, path); !started {
		return err
	}
	k.log.Info("pod running", "pod", key, "netns", path, "attachments", len(atts), "ips", st.ips)
	return k.reportRunning(ctx, key, pod, st)
}

// startContainers runs cfg.Runtime's Start for pod and reports whether the
// containers run. When Start fails the pod is reported Failed and torn
// down, as a completed pod is.
func (k *kubelet) startContainers(ctx context.Context, key string, pod *corev1.Pod, netns string) (bool, error) {
	if k.cfg.Runtime == nil {
		return true, nil
	}
	err := k.cfg.Runtime.Start(ctx, pod, netns)
	if err == nil {
		return true, nil
	}
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	k.log.Error(err, "pod containers failed to start; pod failed", "pod", key)
	k.teardown(ctx, key, pod.UID)
	k.setState(key, nil)
	return false, k.setFailed(ctx, key, pod, err.Error())
}

// add runs CNI ADD for one attachment.
func (k *kubelet) add(ctx context.Context, pod *corev1.Pod, nsPath string, a *attachment) (*current.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, cniTimeout)
	defer cancel()
	rt := &libcni.RuntimeConf{
		ContainerID: string(pod.UID),
		NetNS:       nsPath,
		IfName:      a.ifName,
		Args: [][2]string{
			{"IgnoreUnknown", "true"},
			{"K8S_POD_NAMESPACE", pod.Namespace},
			{"K8S_POD_NAME", pod.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", string(pod.UID)},
			{"K8S_POD_UID", string(pod.UID)},
		},
		CapabilityArgs: a.capArgs,
	}
	res, err := k.cni.AddNetworkList(ctx, a.list, rt)
	if err != nil {
		return nil, err
	}
	cur, err := current.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("convert result: %w", err)
	}
	return cur, nil
}

// podIPs returns a result's sandbox IPs, at most one per family, in order.
func podIPs(res *current.Result) []string {
	if res == nil {
		return nil
	}
	var out []string
	seen := map[bool]bool{}
	for _, ipc := range res.IPs {
		if ipc.Interface != nil && *ipc.Interface >= 0 && *ipc.Interface < len(res.Interfaces) &&
			res.Interfaces[*ipc.Interface].Sandbox == "" {
			continue // a host-side address
		}
		v4 := ipc.Address.IP.To4() != nil
		if ipc.Address.IP == nil || seen[v4] {
			continue
		}
		seen[v4] = true
		out = append(out, ipc.Address.IP.String())
	}
	return out
}

// teardown runs CNI DEL for every cached attachment of the pod with uid
// and deletes its namespace. Errors are logged: a pod going away must not
// stay because of them.
func (k *kubelet) teardown(ctx context.Context, key string, uid types.UID) {
	if k.cfg.Runtime != nil {
		k.cfg.Runtime.Stop(uid)
	}
	atts, err := k.cni.GetCachedAttachments(string(uid))
	if err != nil {
		k.log.Error(err, "read CNI cache", "pod", key, "uid", uid)
	}
	for _, att := range atts {
		k.del(ctx, key, att)
	}
	name := nsName(k.cfg.PodNetNSPrefix, uid)
	if err := nl.DeleteNamedNS(name); err != nil {
		k.log.Error(err, "delete pod network namespace", "pod", key, "netns", name)
	}
}

// del runs CNI DEL for a cached attachment. A failure while the pod's
// namespace is gone is expected (plugins that cannot cope with it) and
// drops the cache entry; other failures keep it, so that the next start's
// GC tries again.
func (k *kubelet) del(ctx context.Context, key string, att *libcni.NetworkAttachment) {
	ctx, cancel := context.WithTimeout(ctx, cniTimeout)
	defer cancel()
	what := fmt.Sprintf("attachment %s (network %s)", att.IfName, att.Network)
	list, err := libcni.ConfListFromBytes(att.Config)
	if err != nil {
		k.log.Error(err, "cached CNI configuration unreadable; dropping it", "pod", key, "attachment", what)
		k.dropCache(att)
		return
	}
	what = fmt.Sprintf("attachment %s (network %s, plugin %s)", att.IfName, att.Network, (&attachment{list: list}).plugin())
	rt := &libcni.RuntimeConf{ContainerID: att.ContainerID, NetNS: att.NetNS, IfName: att.IfName,
		Args: att.CniArgs, CapabilityArgs: att.CapabilityArgs}
	if err := k.cni.DelNetworkList(ctx, list, rt); err != nil {
		if att.NetNS == "" || !nl.IsNetNS(att.NetNS) {
			k.log.V(1).Info("CNI DEL failed with the pod namespace gone; ignored", "pod", key, "attachment", what, "error", err.Error())
			k.dropCache(att)
			return
		}
		k.log.Error(err, "CNI DEL failed", "pod", key, "attachment", what)
		return
	}
	k.log.V(1).Info("attachment deleted", "pod", key, "attachment", what)
}

// dropCache removes an attachment's libcni cache entry (libcni's layout:
// <dir>/results/<network>-<container ID>-<ifname>).
func (k *kubelet) dropCache(att *libcni.NetworkAttachment) {
	f := filepath.Join(k.cfg.CNICacheDir, "results", att.Network+"-"+att.ContainerID+"-"+att.IfName)
	if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
		k.log.Error(err, "remove CNI cache entry", "file", f)
	}
}

// gc removes, before any pod is handled, cached attachments and pod
// namespaces that belong to no pod of the node.
func (k *kubelet) gc(ctx context.Context) {
	liveUIDs, liveNS := map[string]bool{}, map[string]bool{}
	for _, obj := range k.store.List() {
		if pod, ok := obj.(*corev1.Pod); ok {
			liveUIDs[string(pod.UID)] = true
			liveNS[nsName(k.cfg.PodNetNSPrefix, pod.UID)] = true
		}
	}
	atts, err := k.cni.GetCachedAttachments("")
	if err != nil {
		k.log.Error(err, "GC: read CNI cache")
	}
	for _, att := range atts {
		if !liveUIDs[att.ContainerID] {
			k.log.Info("GC: deleting attachment of a pod no longer on the node", "uid", att.ContainerID, "ifname", att.IfName, "network", att.Network)
			k.del(ctx, "uid "+att.ContainerID, att)
		}
	}
	names, err := nl.ListNamedNS(k.cfg.PodNetNSPrefix)
	if err != nil {
		k.log.Error(err, "GC: list network namespaces")
	}
	for _, n := range names {
		if liveNS[n] {
			continue
		}
		k.log.Info("GC: deleting network namespace of no pod", "netns", n)
		if err := nl.DeleteNamedNS(n); err != nil {
			k.log.Error(err, "GC: delete network namespace", "netns", n)
		}
	}
}

// confirmDeletion deletes the pod for good, as kubelet does once its
// containers are gone: grace period 0, and only this pod (UID), not a
// successor of the same name.
func (k *kubelet) confirmDeletion(ctx context.Context, pod *corev1.Pod) error {
	grace := int64(0)
	uid := pod.UID
	err := k.cs.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &uid}})
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return fmt.Errorf("pod %s/%s: confirm deletion: %w", pod.Namespace, pod.Name, err)
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
