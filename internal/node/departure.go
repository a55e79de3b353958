package node

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/migration"
)

// MigrationSource is a live migration's source port on this node while
// its guest still runs here (Plan.MigrationSources).
type MigrationSource struct {
	Port datapath.Port
	VMI  types.NamespacedName
	Pod  string // the source launcher pod
}

// departures follows this node's live-migration source ports until the
// guest leaves: it reads what each port's pod sends, remembers the last
// frames only the guest sends (guestFrame: the source pod's own answers
// to the probes do not count), and probes the guest from the
// network's gateway every probeInterval so that a quiet guest answers
// until it pauses. When the API moves the VMI away (the port Departed),
// the last frame per network is published on the source pod
// (migration.LastFramesAnnotation), where the target's kvnet-node reads
// it. A source that stops migrating without departing (a failed or
// cancelled migration) is forgotten.
type departures struct {
	node  string
	netns string
	log   logr.Logger
	now   func() time.Time
	// publish is handed each source pod's last frames once its guest
	// left; it must not block.
	publish func(pod types.NamespacedName, frames map[string]migration.LastFrame)

	mu       sync.Mutex
	tracking map[string]*departing // network/MAC -> source port followed
	wg       sync.WaitGroup
}

// departing is one source port followed.
type departing struct {
	src MigrationSource
	f   *os.File
	// closed is set before f is closed: its reader's error is then no
	// news.
	closed atomic.Bool
	// last is the last guest frame read (zero: none yet); guarded by
	// departures.mu.
	last migration.LastFrame
}

func newDepartures(node, netns string, log logr.Logger, publish func(types.NamespacedName, map[string]migration.LastFrame)) *departures {
	return &departures{node: node, netns: netns, log: log, now: time.Now, publish: publish, tracking: map[string]*departing{}}
}

// sync follows exactly the plan's migration sources (probing each from
// probeFrom's gateway of its network) and publishes the last frames of
// those whose guest left (departed: Plan.DepartedSources).
func (d *departures) sync(sources []MigrationSource, departed map[string]bool, probeFrom map[string]Gateway) {
	want := map[string]MigrationSource{}
	for _, s := range sources {
		want[switchKey(s.Port.Network, s.Port.MAC.String())] = s
	}
	out := map[types.NamespacedName]map[string]migration.LastFrame{}
	d.mu.Lock()
	for k, t := range d.tracking {
		if w, ok := want[k]; ok && w.Port.HostIfName == t.src.Port.HostIfName {
			continue
		}
		t.closed.Store(true)
		t.f.Close() // ends its reader and prober
		delete(d.tracking, k)
		if !departed[k] {
			continue
		}
		last := t.last
		last.Node = d.node // also when no frame was seen
		// Its reader may still append to (or compact) t.last.Earlier
		// until it sees the socket closed.
		last.Earlier = slices.Clone(last.Earlier)
		pod := types.NamespacedName{Namespace: t.src.VMI.Namespace, Name: t.src.Pod}
		if out[pod] == nil {
			out[pod] = map[string]migration.LastFrame{}
		}
		out[pod][t.src.Port.Network] = last
	}
	for k, s := range want {
		if _, ok := d.tracking[k]; ok {
			continue
		}
		f, err := openPortSocket(d.netns, s.Port.HostIfName)
		if err == nil {
			err = stampReceived(f)
			if err != nil {
				f.Close()
			}
		}
		if err != nil {
			d.log.Error(err, "follow a migration source port; the switch-over's report will lack the guest's last frame here", "port", s.Port.HostIfName)
			continue
		}
		t := &departing{src: s, f: f}
		d.tracking[k] = t
		d.wg.Go(func() { d.read(t) })
		if gw, ok := probeFrom[s.Port.Network]; ok {
			if dst, ok := firstIPv4Prefix(s.Port.IPs); ok {
				d.wg.Go(func() { d.probe(t, gw, dst) })
			}
		}
	}
	d.mu.Unlock()
	for pod, frames := range out {
		d.publish(pod, frames)
	}
}

// read records the last frame on t's socket that only its guest sends,
// with the time the kernel received it, until the socket is closed.
func (d *departures) read(t *departing) {
	buf, oob := make([]byte, 128), make([]byte, 64)
	for {
		n, at, err := readStamped(t.f, buf, oob)
		if errors.Is(err, unix.ENETDOWN) {
			continue // the pod's end went down (reported once); it may come back
		}
		if err != nil {
			if !t.closed.Load() {
				d.log.Error(err, "read a migration source port", "port", t.src.Port.HostIfName)
			}
			return
		}
		// The pod's own answers to the probes (TTL 64) are not the
		// guest's: the source pod answers them once its guest left.
		what := guestFrame(buf[:n], t.src.Port)
		if what == "" {
			continue
		}
		if at.IsZero() {
			at = d.now()
		}
		d.mu.Lock()
		if !t.last.At.IsZero() {
			t.last.Earlier = append(t.last.Earlier, migration.SeenFrame{At: t.last.At, Frame: t.last.Frame})
			if n := len(t.last.Earlier); n > migration.MaxEarlierFrames {
				t.last.Earlier = append(t.last.Earlier[:0], t.last.Earlier[n-migration.MaxEarlierFrames:]...)
			}
		}
		t.last.Node, t.last.At, t.last.Frame = d.node, at, what
		d.mu.Unlock()
	}
}

// stampReceived has the kernel time each frame f receives
// (SO_TIMESTAMPNS): a reader late under load still dates the frame right.
func stampReceived(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
	}); err != nil {
		return err
	}
	return serr
}

// readStamped reads one frame from f into buf, with the time the kernel
// received it (zero if the control message oob has none).
func readStamped(f *os.File, buf, oob []byte) (n int, at time.Time, err error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, time.Time{}, err
	}
	var oobn int
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf, oob, 0)
		return !errors.Is(rerr, unix.EAGAIN)
	}); err != nil {
		return 0, time.Time{}, err
	}
	if rerr != nil {
		return 0, time.Time{}, rerr
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return n, time.Time{}, nil
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= 16 {
			sec := int64(binary.NativeEndian.Uint64(m.Data[0:8]))
			nsec := int64(binary.NativeEndian.Uint64(m.Data[8:16]))
			return n, time.Unix(sec, nsec), nil
		}
	}
	return n, time.Time{}, nil
}

// probe sends an echo request from gw to dst into t's port every
// probeInterval until the socket is closed: the guest's answers keep its
// last frame current while it runs here.
func (d *departures) probe(t *departing, gw Gateway, dst netip.Addr) {
	tick := time.NewTicker(probeInterval)
	defer tick.Stop()
	for seq := uint16(1); ; seq++ {
		if _, err := t.f.Write(probeFrame(t.src.Port.MAC, gw.MAC, gw.IP, dst, seq)); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			d.log.V(1).Info("migration source probe not sent", "port", t.src.Port.HostIfName, "error", err.Error())
		}
		<-tick.C
	}
}

// close stops following every source port and waits for the readers.
func (d *departures) close() {
	d.mu.Lock()
	for k, t := range d.tracking {
		t.closed.Store(true)
		t.f.Close()
		delete(d.tracking, k)
	}
	d.mu.Unlock()
	d.wg.Wait()
}

// newLastFramePublisher writes a source pod's last frames into its
// migration.LastFramesAnnotation (merged with what it holds), reading the
// pod from the API (r) and patching it with its resourceVersion, again on
// a conflict. It returns at once.
func newLastFramePublisher(ctx context.Context, c client.Client, r client.Reader) func(types.NamespacedName, map[string]migration.LastFrame) {
	logger := log.FromContext(ctx)
	return func(key types.NamespacedName, frames map[string]migration.LastFrame) {
		go func() {
			err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
				var pod corev1.Pod
				if err := r.Get(ctx, key, &pod); err != nil {
					return err
				}
				patch := map[string]any{"metadata": map[string]any{
					"resourceVersion": pod.ResourceVersion,
					"annotations":     map[string]string{migration.LastFramesAnnotation: migration.MergeLastFrames(pod.Annotations[migration.LastFramesAnnotation], frames)},
				}}
				b, err := json.Marshal(patch)
				if err != nil {
					return err
				}
				return c.Patch(ctx, &pod, client.RawPatch(types.MergePatchType, b))
			})
			if err != nil {
				logger.Error(err, "live migration: cannot publish the guest's last frames on its source pod; the target's switch-over report will lack them", "pod", key.String())
				return
			}
			for network, f := range frames {
				logger.Info("live migration: the guest left this node", "pod", key.String(), "network", network, "lastFrame", f.Frame, "at", f.At)
			}
		}()
	}
}

// newArrivalPublisher marks a migration target pod (on this node) with
// migration.GuestArrivedAnnotation: the guest's first frame reached its
// port at at. It returns at once.
func newArrivalPublisher(ctx context.Context, c client.Client) func(types.NamespacedName, time.Time) {
	logger := log.FromContext(ctx)
	return func(key types.NamespacedName, at time.Time) {
		go func() {
			b, err := json.Marshal(map[string]any{"metadata": map[string]any{
				"annotations": map[string]string{migration.GuestArrivedAnnotation: at.UTC().Format(time.RFC3339Nano)},
			}})
			if err == nil {
				pod := &corev1.Pod{}
				pod.Namespace, pod.Name = key.Namespace, key.Name
				err = c.Patch(ctx, pod, client.RawPatch(types.MergePatchType, b))
			}
			if err != nil {
				logger.Error(err, "live migration: cannot mark the target pod's guest arrived; the source node keeps its port open until KubeVirt moves the VMI", "pod", key.String())
			}
		}()
	}
}
