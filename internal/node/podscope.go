package node

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"kvnet.io/kvnet/internal/podnetworks"
)

// Pod scopes (Config.PodScope): which pods of the cluster a kvnet-node
// watches.
const (
	// PodScopeCluster watches every pod of the cluster (the default).
	PodScopeCluster = "cluster"
	// PodScopeNetworks watches this node's pods, and the pods of the
	// networks it serves (those with a pod here, and the primary networks
	// whose node ports it opens) by their network label
	// (podnetworks.NetworkLabel): its memory, plan and API traffic grow
	// with its networks, not with the cluster.
	PodScopeNetworks = "networks"
)

// CheckPodScope refuses a pod scope other than PodScopeCluster ("" too)
// and PodScopeNetworks, naming the value.
func CheckPodScope(scope string) error {
	switch scope {
	case "", PodScopeCluster, PodScopeNetworks:
		return nil
	}
	return fmt.Errorf("pod-scope %q: want %q or %q", scope, PodScopeCluster, PodScopeNetworks)
}

// scopeGrace is how long a network's pods stay watched after the node
// stops needing them (its last pod here went): a pod that comes back
// soon, as a VM's launcher pod after a stop/start or a migration back,
// finds them known (a variable for tests).
var scopeGrace = time.Minute

// scopeSyncWait is how long the agent holds its applies for a new watch
// to list its network's pods (a variable for tests).
var scopeSyncWait = 10 * time.Second

// ownPodsSelector selects the pods of node (the pod cache's field
// selector under PodScopeNetworks).
func ownPodsSelector(node string) fields.Selector {
	return fields.OneTermEqualSelector("spec.nodeName", node)
}

// podScope keeps, under PodScopeNetworks, one watch of pods per network
// the node needs, selected by the network's label: sync starts and
// stops them after each plan. Each watch's events go to handler (as the
// pod cache's do); a new watch kicks the loop once it has synced.
type podScope struct {
	node    string
	cs      kubernetes.Interface
	handler toolscache.ResourceEventHandler
	kick    func()
	now     func() time.Time

	mu      sync.Mutex
	watches map[string]*networkWatch // by network name
}

type networkWatch struct {
	inf      toolscache.SharedIndexInformer
	stop     chan struct{}
	started  time.Time
	synced   atomic.Bool // it has listed the network's pods
	unneeded time.Time   // when the node stopped needing it; zero while needed
}

// newPodScope returns a podScope; its handler is set before its first
// sync.
func newPodScope(node string, cs kubernetes.Interface, kick func()) *podScope {
	return &podScope{node: node, cs: cs, kick: kick, now: time.Now, watches: map[string]*networkWatch{}}
}

// sync makes the watches those of needed (network names), keeping an
// unneeded one for scopeGrace. It reports the networks whose watch it
// started and stopped.
func (s *podScope) sync(ctx context.Context, needed map[string]bool) (started, stopped []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for _, name := range slices.Sorted(maps.Keys(needed)) {
		if w, ok := s.watches[name]; ok {
			w.unneeded = time.Time{}
			continue
		}
		s.watches[name] = s.start(ctx, name)
		started = append(started, name)
	}
	for _, name := range slices.Sorted(maps.Keys(s.watches)) {
		w := s.watches[name]
		switch {
		case needed[name]:
		case w.unneeded.IsZero():
			w.unneeded = now
		case now.Sub(w.unneeded) >= scopeGrace:
			close(w.stop)
			delete(s.watches, name)
			stopped = append(stopped, name)
		}
	}
	if len(started)+len(stopped) > 0 {
		log.FromContext(ctx).Info("watching the pods of networks", "started", started, "stopped", stopped, "networks", len(s.watches))
	}
	watchedNetworksGauge.WithLabelValues(s.node).Set(float64(len(s.watches)))
	return started, stopped
}

// start begins watching the pods labelled with network's label.
func (s *podScope) start(ctx context.Context, network string) *networkWatch {
	label := podnetworks.NetworkLabel(network)
	lw := toolscache.NewFilteredListWatchFromClient(s.cs.CoreV1().RESTClient(), "pods", metav1.NamespaceAll, func(o *metav1.ListOptions) {
		o.LabelSelector = label
	})
	inf := toolscache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, toolscache.Indexers{})
	_ = inf.SetTransform(func(o any) (any, error) { return trimPod(o) })
	w := &networkWatch{inf: inf, stop: make(chan struct{}), started: s.now()}
	if _, err := inf.AddEventHandler(s.handler); err != nil {
		log.FromContext(ctx).Error(err, "watch a network's pods", "network", network)
	}
	go inf.Run(w.stop)
	go func() {
		if toolscache.WaitForCacheSync(w.stop, inf.HasSynced) {
			w.synced.Store(true)
			s.kick()
		}
	}()
	return w
}

// unsynced returns the networks whose watch has not listed their pods
// yet: started less than scopeSyncWait before now (waiting), or longer
// ago (overdue).
func (s *podScope) unsynced(now time.Time) (waiting, overdue []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(s.watches)) {
		w := s.watches[name]
		switch {
		case w.synced.Load():
		case now.Sub(w.started) < scopeSyncWait:
			waiting = append(waiting, name)
		default:
			overdue = append(overdue, name)
		}
	}
	return waiting, overdue
}

// stopAll ends every watch.
func (s *podScope) stopAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, w := range s.watches {
		close(w.stop)
		delete(s.watches, name)
	}
	watchedNetworksGauge.WithLabelValues(s.node).Set(0)
}

// pods returns own (the node's pods) and the watched networks' pods, each
// once. The pods are the informers' (trimmed): read only.
func (s *podScope) pods(own []corev1.Pod) []corev1.Pod {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := make(map[types.UID]bool, len(own))
	out := slices.Clip(own)
	for _, p := range own {
		seen[p.UID] = true
	}
	for _, name := range slices.Sorted(maps.Keys(s.watches)) {
		for _, o := range s.watches[name].inf.GetStore().List() {
			p, ok := o.(*corev1.Pod)
			if !ok || seen[p.UID] {
				continue
			}
			seen[p.UID] = true
			out = append(out, *p)
		}
	}
	return out
}

// networks returns the watched networks' names, sorted.
func (s *podScope) networks() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.watches))
}

// get returns a watched network's pod by key.
func (s *podScope) get(key types.NamespacedName) (*corev1.Pod, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.watches {
		o, ok, err := w.inf.GetStore().GetByKey(key.Namespace + "/" + key.Name)
		if err != nil || !ok {
			continue
		}
		if p, ok := o.(*corev1.Pod); ok {
			return p, true
		}
	}
	return nil, false
}
