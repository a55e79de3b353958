package simlauncher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/lab/guest"
	"kvnet.io/kvnet/internal/lab/simvirt"
)

// Config configures a Launcher.
type Config struct {
	// RESTConfig reaches the API server, to read the VMI of a launcher pod.
	RESTConfig *rest.Config
	// Image is the guest kernel and initramfs (guest.EnsureImage).
	Image guest.Image
	// StateDir holds one console log per VMI, ConsoleLog(namespace, name),
	// appended to by every guest the VMI runs (restarts, migrations), and
	// the sockets migrations stream through.
	StateDir string
	// MemoryMB is each guest's memory; 0 is guest.DefaultMemoryMB.
	MemoryMB int
	// DNS is what the launcher's own DHCP server (bridge binding with a
	// pod IP, masquerade) offers, and its IPv6 addresses what its DHCPv6
	// server (masquerade, where the pod has IPv6) offers; empty offers
	// none.
	DNS []netip.Addr
	// PodNetNS returns the network namespace of a pod on a simulated node:
	// with a dedicated migration network, the stream goes between the
	// nodes' handler pods (simvirt.HandlerPodName). nil: every migration
	// streams through a local unix socket.
	PodNetNS func(*corev1.Pod) (string, error)
	// Log receives what happens; the zero value discards.
	Log logr.Logger
}

// Launcher runs one QEMU guest per running virt-launcher pod of the
// simulated nodes: it is a simkubelet.Runtime. One Launcher serves every
// node of a lab, so that a migration's target can take its state from the
// source guest.
type Launcher struct {
	cfg    Config
	reader client.Reader

	mu     sync.Mutex
	guests map[types.UID]*running // by launcher pod UID
}

// running is the guest of one launcher pod.
type running struct {
	vmi     types.NamespacedName
	pod     string
	vm      *guest.VM
	plumbed []*Plumbed
	moved   bool // migrated away: its QEMU only waits to be stopped
	// inherited are the leases (DHCPv4, DHCPv6; by guest NIC) the guest
	// reported before it was migrated here (see GuestInterfaces).
	inherited [2]map[string]guest.Lease
}

// NoGuestAnnotation on a VMI (from its VM's template) set to "true" keeps
// the Launcher from running a guest for it: its launcher pods are only
// their network namespaces, as without a runtime. kvnet-lab chaos boots a
// few of its VMs and not the many others.
const NoGuestAnnotation = "simlauncher.kvnet.io/no-guest"

// ErrNoGuest is returned for a launcher pod whose guest cannot run.
var ErrNoGuest = errors.New("guest cannot run")

// New checks that QEMU is installed and returns a Launcher.
func New(cfg Config) (*Launcher, error) {
	if err := guest.CheckQEMU(); err != nil {
		return nil, err
	}
	if cfg.RESTConfig == nil || cfg.StateDir == "" || cfg.Image.Kernel == "" {
		return nil, errors.New("simlauncher: Config needs RESTConfig, StateDir and Image")
	}
	if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("simlauncher: %w", err)
	}
	scheme, err := simvirt.NewScheme()
	if err != nil {
		return nil, err
	}
	reader, err := client.New(cfg.RESTConfig, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("simlauncher: %w", err)
	}
	return &Launcher{cfg: cfg, reader: reader, guests: map[types.UID]*running{}}, nil
}

// ConsoleLog is the console log of the guests of VMI namespace/name.
func (l *Launcher) ConsoleLog(namespace, name string) string {
	return ConsoleLog(l.cfg.StateDir, namespace, name)
}

// ConsoleLog is the console log of the guests of VMI namespace/name under
// a launcher's state directory dir.
func ConsoleLog(dir, namespace, name string) string {
	return filepath.Join(dir, namespace+"_"+name+".log")
}

// MigrationProgressFile is the file in dir where the source launcher of
// VMI namespace/name keeps the progress of its latest outgoing migration
// (MigrationProgress, JSON), from QEMU's query-migrate, as it goes: what
// KubeVirt's migration metrics tell, for tests and the curious.
func MigrationProgressFile(dir, namespace, name string) string {
	return filepath.Join(dir, namespace+"_"+name+".migration.json")
}

// MigrationProgress is the state of a migration as its source QEMU
// reports it.
type MigrationProgress struct {
	Pod         string `json:"pod"`         // the source launcher pod
	Status      string `json:"status"`      // query-migrate's: setup, active, completed, failed, ...
	Transferred int64  `json:"transferred"` // RAM bytes sent so far
}

// ReadMigrationProgress reads a MigrationProgressFile.
func ReadMigrationProgress(path string) (MigrationProgress, error) {
	var p MigrationProgress
	b, err := os.ReadFile(path)
	if err != nil {
		return p, err
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("migration progress %s: %w", path, err)
	}
	return p, nil
}

// writeProgress replaces the progress file at path (atomically: readers
// never see half of it).
func writeProgress(path string, p MigrationProgress) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Guest returns the guest running for launcher pod uid, nil when none.
func (l *Launcher) Guest(uid types.UID) *guest.VM {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r := l.guests[uid]; r != nil {
		return r.vm
	}
	return nil
}

// Start starts the guest of a virt-launcher pod (other pods run nothing):
// it reads the pod's VMI, plumbs each interface for its binding in the
// pod's network namespace netns, and starts QEMU there with the VMI's
// MACs. For a migration target pod, QEMU waits for the state of the
// source pod's guest, which is then migrated to it (memory and devices;
// the guest's connections survive): Start returns once the migration
// completed, so the pod reports Running when the guest runs on it.
func (l *Launcher) Start(ctx context.Context, pod *corev1.Pod, netns string) error {
	if pod.Labels[kubevirtv1.AppLabel] != kubevirtv1.VirtLauncherValue {
		return nil
	}
	l.mu.Lock()
	r := l.guests[pod.UID]
	l.mu.Unlock()
	if r != nil {
		select {
		case <-r.vm.Done():
			l.Stop(pod.UID) // it ended: boot a new one
		default:
			return nil
		}
	}
	// The kubelet's copy of the pod may predate the allocation kvnet wrote
	// to it (kvnet-cni read it from the API server).
	var fresh corev1.Pod
	if err := l.get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, &fresh); err != nil {
		return fmt.Errorf("virt-launcher: read pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if fresh.UID != pod.UID {
		return fmt.Errorf("virt-launcher: pod %s/%s was replaced", pod.Namespace, pod.Name)
	}
	pod = &fresh
	vmi, err := l.readVMI(ctx, pod)
	if err != nil {
		return err
	}
	if vmi.Annotations[NoGuestAnnotation] == "true" {
		return nil
	}
	ifaces, err := Ifaces(vmi, pod, l.cfg.DNS)
	if err != nil {
		return err
	}
	r = &running{vmi: types.NamespacedName{Namespace: vmi.Namespace, Name: vmi.Name}, pod: pod.Name}
	fail := func(err error) error {
		for _, p := range r.plumbed {
			p.Close()
		}
		if r.vm != nil {
			r.vm.Stop()
		}
		return err
	}
	var nics []guest.NIC
	for _, ifc := range ifaces {
		p, err := Plumb(context.WithoutCancel(ctx), netns, ifc, l.cfg.Log.WithValues("vmi", r.vmi.String(), "pod", pod.Name))
		if err != nil {
			return fail(fmt.Errorf("virt-launcher: %w", err))
		}
		r.plumbed = append(r.plumbed, p)
		nics = append(nics, guest.NIC{Tap: p.Tap, MAC: p.GuestMAC})
	}
	gc := guest.Config{
		Name: vmi.Name, Image: l.cfg.Image, NetNS: netns, NICs: nics, MemoryMB: l.cfg.MemoryMB,
		ConsoleLog: l.ConsoleLog(vmi.Namespace, vmi.Name),
		QMPSocket:  filepath.Join(l.cfg.StateDir, string(pod.UID)[:8]+".qmp"),
	}
	var source *running
	if migrationTarget(vmi, pod) {
		if source = l.sourceOf(r.vmi, pod.UID); source == nil {
			return fail(fmt.Errorf("virt-launcher: migration target %s: %w: no guest of VMI %s runs in this lab to migrate from", pod.Name, ErrNoGuest, r.vmi))
		}
		gc.Incoming = "unix:" + filepath.Join(l.cfg.StateDir, string(pod.UID)[:8]+".migration")
	}
	if r.vm, err = guest.Start(ctx, gc); err != nil {
		return fail(fmt.Errorf("virt-launcher: %w", err))
	}
	if source != nil {
		if err := l.migrate(ctx, source, r, gc.Incoming); err != nil {
			return fail(err)
		}
	}
	l.mu.Lock()
	l.guests[pod.UID] = r
	l.mu.Unlock()
	l.cfg.Log.Info("guest started", "vmi", r.vmi.String(), "pod", pod.Name, "pid", r.vm.PID(), "nics", len(nics),
		"console", gc.ConsoleLog, "migratedFrom", podName(source))
	return nil
}

// targetWait bounds how long a migration target pod waits for its VMI's
// migrationState to name it. virt-controller writes it right after it
// made the pod, but a busy or restarting control plane (the chaos run
// kills it every few seconds) can take far longer than usual; KubeVirt's
// own target waits minutes for its migration to start.
const targetWait = 2 * time.Minute

// readVMI reads the VMI of launcher pod. A migration target pod may be
// seen before virt-controller wrote the VMI's migrationState naming it;
// the VMI is read again until it does (or the pod is deleted: its
// migration is over), so that a target never boots a second guest of a
// running VM.
func (l *Launcher) readVMI(ctx context.Context, pod *corev1.Pod) (*kubevirtv1.VirtualMachineInstance, error) {
	key := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Annotations[kubevirtv1.DomainAnnotation]}
	deadline := time.Now().Add(targetWait)
	for {
		var vmi kubevirtv1.VirtualMachineInstance
		if err := l.get(ctx, key, &vmi); err != nil {
			return nil, fmt.Errorf("virt-launcher: read VMI %s: %w", key, err)
		}
		m := vmi.Status.MigrationState
		if pod.Labels[simvirt.MigrationJobUIDLabel] == "" || m != nil && m.TargetPod == pod.Name {
			return &vmi, nil
		}
		var now corev1.Pod
		err := l.reader.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, &now)
		switch {
		case apierrors.IsNotFound(err) || err == nil && (now.UID != pod.UID || now.DeletionTimestamp != nil):
			return nil, fmt.Errorf("virt-launcher: migration target %s: deleted before VMI %s named it in status.migrationState", pod.Name, key)
		case time.Now().After(deadline):
			return nil, fmt.Errorf("virt-launcher: migration target %s: VMI %s does not name it in status.migrationState after %s", pod.Name, key, targetWait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// apiOutage bounds how long the launcher waits out an API server that
// does not answer (restarting, say) before its pod fails (a variable for
// tests).
var apiOutage = time.Minute

// get reads key into obj, retrying what an API server outage returns
// (anything but NotFound) for up to apiOutage: the pod's start must not
// fail because the API server restarts meanwhile, as a real launcher's
// would not.
func (l *Launcher) get(ctx context.Context, key types.NamespacedName, obj client.Object) error {
	deadline := time.Now().Add(apiOutage)
	wait := 100 * time.Millisecond
	for {
		err := l.reader.Get(ctx, key, obj)
		if err == nil || apierrors.IsNotFound(err) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// migrationTarget reports whether pod is the target of the VMI's
// migration in progress (a target pod adopted after the migration is the
// VMI's pod like any other).
func migrationTarget(vmi *kubevirtv1.VirtualMachineInstance, pod *corev1.Pod) bool {
	m := vmi.Status.MigrationState
	return pod.Labels[simvirt.MigrationJobUIDLabel] != "" && m != nil && m.TargetPod == pod.Name && !m.Completed && !m.Failed
}

func podName(r *running) string {
	if r == nil {
		return ""
	}
	return r.pod
}

// sourceOf returns the guest of VMI vmi running for another pod than uid.
func (l *Launcher) sourceOf(vmi types.NamespacedName, uid types.UID) *running {
	l.mu.Lock()
	defer l.mu.Unlock()
	for u, r := range l.guests {
		if u != uid && r.vmi == vmi && !r.moved {
			select {
			case <-r.vm.Done():
			default:
				return r
			}
		}
	}
	return nil
}

// migrate streams the source guest's state to the target QEMU waiting on
// uri and waits for the migration to complete.
func (l *Launcher) migrate(ctx context.Context, source, target *running, uri string) error {
	// KubeVirt's migrations.bandwidthPerMigration caps the stream.
	bw, err := l.bandwidth(ctx)
	if err != nil {
		return fmt.Errorf("virt-launcher: migrate %s: %w", source.vmi, err)
	}
	// The target announces the guest (RARP) as soon as it runs: kvnet's
	// switch-over starts with that frame. QEMU waits 50 ms by default.
	if _, err := target.vm.QMP().Execute("migrate-set-parameters", map[string]any{"announce-initial": 1}); err != nil {
		return fmt.Errorf("virt-launcher: migrate %s: set announce-initial: %w", source.vmi, err)
	}
	if _, err := source.vm.QMP().Execute("migrate-set-parameters", map[string]any{"max-bandwidth": bw}); err != nil {
		return fmt.Errorf("virt-launcher: migrate %s: set bandwidth %d: %w", source.vmi, bw, err)
	}
	streamURI, stop, err := l.stream(ctx, source, uri)
	if err != nil {
		return fmt.Errorf("virt-launcher: migrate %s from pod %s: %w", source.vmi, source.pod, err)
	}
	defer stop()
	if err := source.vm.QMP().Migrate(streamURI); err != nil {
		return fmt.Errorf("virt-launcher: migrate %s from pod %s: %w", source.vmi, source.pod, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	progress := MigrationProgressFile(l.cfg.StateDir, source.vmi.Namespace, source.vmi.Name)
	var last MigrationProgress
	info, err := source.vm.QMP().WaitMigrationFunc(wctx, func(mi guest.MigrationInfo) {
		p := MigrationProgress{Status: mi.Status, Pod: source.pod}
		if mi.RAM != nil {
			p.Transferred = mi.RAM.Transferred
		}
		if p != last {
			last = p
			if err := writeProgress(progress, p); err != nil {
				l.cfg.Log.Error(err, "write migration progress", "vmi", source.vmi.String())
			}
		}
	})
	if err != nil {
		return fmt.Errorf("virt-launcher: migrate %s from pod %s: %w", source.vmi, source.pod, err)
	}
	// The guest holds the leases it reported on the source; its new QEMU's
	// console shows only what it prints from now on.
	target.inherited = source.leases()
	l.mu.Lock()
	source.moved = true
	l.mu.Unlock()
	kv := []any{"vmi", source.vmi.String(), "from", source.pod, "to", target.pod,
		"totalMs", info.TotalTimeMS, "downtimeMs", info.DowntimeMS}
	if stop, resume, ok := guestPause(ctx, source, target); ok {
		kv = append(kv, "pauseMs", float64(resume.Sub(stop).Microseconds())/1000,
			"stopped", stop.UTC().Format(time.RFC3339Nano), "resumed", resume.UTC().Format(time.RFC3339Nano))
	}
	l.cfg.Log.Info("guest migrated", kv...)
	return nil
}

// guestPause is how long the migrated guest ran nowhere: from the source
// QEMU's last STOP event (the migration's final stage stops the guest) to
// the target QEMU's RESUME, both stamped by QEMU on this machine's clock.
// QEMU's own "downtime" figure ends when the source sent the last state,
// before the target has loaded it and started the guest. It returns both
// stamps, waiting a few seconds for the target's RESUME; ok is false
// without both events.
func guestPause(ctx context.Context, source, target *running) (stop, resume time.Time, ok bool) {
	for _, ev := range source.vm.QMP().Events() {
		if ev.Name == "STOP" {
			stop = ev.Time
		}
	}
	if stop.IsZero() {
		return stop, resume, false
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, ev := range target.vm.QMP().Events() {
			if ev.Name == "RESUME" && ev.Time.After(stop) {
				return stop, ev.Time, true
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return stop, resume, false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// unlimitedBandwidth is QEMU's max-bandwidth for "no limit" (bytes/s).
const unlimitedBandwidth = int64(1) << 62

// bandwidth is the KubeVirt CR's spec.configuration.migrations
// .bandwidthPerMigration in bytes per second (the first CR by name, in any
// namespace), unlimited when unset or without a CR.
func (l *Launcher) bandwidth(ctx context.Context) (int64, error) {
	var kvs kubevirtv1.KubeVirtList
	if err := l.reader.List(ctx, &kvs); err != nil {
		return 0, fmt.Errorf("read the KubeVirt CR: %w", err)
	}
	for _, kv := range kvs.Items {
		if mc := kv.Spec.Configuration.MigrationConfiguration; mc != nil && mc.BandwidthPerMigration != nil {
			if v := mc.BandwidthPerMigration.Value(); v > 0 {
				return v, nil
			}
		}
	}
	return unlimitedBandwidth, nil
}

// Stop stops the guest of launcher pod uid, if any, and its DHCP servers.
func (l *Launcher) Stop(uid types.UID) {
	l.mu.Lock()
	r := l.guests[uid]
	delete(l.guests, uid)
	l.mu.Unlock()
	if r == nil {
		return
	}
	r.vm.Stop()
	for _, p := range r.plumbed {
		p.Close()
	}
	l.cfg.Log.Info("guest stopped", "vmi", r.vmi.String(), "pod", r.pod)
}

// Close stops every guest.
func (l *Launcher) Close() {
	l.mu.Lock()
	uids := make([]types.UID, 0, len(l.guests))
	for u := range l.guests {
		uids = append(uids, u)
	}
	l.mu.Unlock()
	for _, u := range uids {
		l.Stop(u)
	}
}

// Ifaces returns what to plumb for vmi's interfaces in its launcher pod, in
// the order of the guest's NICs, or an error naming an interface whose
// binding the lab cannot run.
func Ifaces(vmi *kubevirtv1.VirtualMachineInstance, pod *corev1.Pod, dns []netip.Addr) ([]Iface, error) {
	specs := map[string]kubevirtv1.Interface{}
	for _, i := range vmi.Spec.Domain.Devices.Interfaces {
		specs[i.Name] = i
	}
	var out []Iface
	for _, st := range simvirt.PodInterfaces(vmi, pod) {
		spec := specs[st.Name]
		ifc := Iface{Name: st.Name, PodIface: st.PodInterfaceName, MAC: st.MAC, Index: len(out), DNS: dns}
		switch {
		case spec.Bridge != nil:
			ifc.Binding = BindingBridge
		case spec.Masquerade != nil:
			ifc.Binding = BindingMasquerade
			for _, p := range spec.Ports {
				ifc.Ports = append(ifc.Ports, Port{Protocol: p.Protocol, Port: p.Port})
			}
		case spec.Binding != nil:
			ifc.Binding = BindingManagedTap
		default:
			return nil, fmt.Errorf("virt-launcher: interface %q: %w: its binding is not bridge, masquerade or a managedTap plugin", st.Name, ErrNoGuest)
		}
		if err := ifc.Validate(); err != nil {
			return nil, fmt.Errorf("virt-launcher: %w", err)
		}
		out = append(out, ifc)
	}
	return out, nil
}
