package cni

// Garbage collection of the default network of sandboxes whose DEL never
// reached kvnet-cni. addWithDefault keeps, for each container, the
// configuration its eth0 was added with (savedConfPath) and a record of
// how (keptRecordPath: netns, ifname, CNI_ARGS, capability arguments);
// delDefault forgets both. When a runtime or Multus loses that DEL, the
// default network's address (a host-local lease, ...) would stay
// allocated for ever. So every kvnet-cni ADD (first) and DEL (after its
// own work) looks at what is kept and runs the default network's DEL for
// the containers whose sandbox is gone, with the kept configuration and
// the recorded arguments, then forgets them.
//
// "Gone" is the recorded netns path no longer existing: the runtime
// removes a sandbox's netns only after that sandbox's CNI DEL returned,
// so a container whose netns exists is never collected, whatever its
// age. An entry without a record (kept by a kvnet-cni before the record
// existed) takes the netns and arguments from libcni's cache of the
// default network's ADD, which holds them; without either it is left
// alone and logged: its age cannot tell a long-lived pod from a gone one,
// and releasing a running pod's address would hand it to a second pod,
// worse than the leak.
//
// Collection never fails the verb it runs in: errors go to stderr and
// to the status file (gcStatusPath), and the entry is tried again next
// time. It takes a lock (flock, non-blocking: a busy lock means another
// kvnet-cni is collecting, and this one skips) and a time budget.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/skel"
	"golang.org/x/sys/unix"
)

// Bounds on the time collection adds to the verb it runs in; what is not
// done in time is done by a later ADD or DEL.
const (
	gcBudgetAdd = 5 * time.Second
	gcBudgetDel = 2 * time.Second
	// gcGrace is how long past its budget a verb waits for collection to
	// return once its plugins were told to stop.
	gcGrace = time.Second
)

// keptRecord is how a container's eth0 was added to the default network:
// what the default network's DEL needs once the sandbox is gone.
type keptRecord struct {
	// NetNS is the runtime's CNI_NETNS at ADD; its disappearing is what
	// says the sandbox is gone.
	NetNS  string `json:"netns"`
	IfName string `json:"ifName"`
	// Args are the CNI_ARGS the default network was added with
	// (K8S_POD_NAMESPACE, K8S_POD_NAME, K8S_POD_INFRA_CONTAINER_ID,
	// K8S_POD_UID, IgnoreUnknown, ...).
	Args [][2]string `json:"args,omitempty"`
	// CapabilityArgs are the runtime's (portMappings, ...).
	CapabilityArgs map[string]any `json:"capabilityArgs,omitempty"`
}

// parseKeptRecord reads a record; it names the field that is missing.
func parseKeptRecord(b []byte) (keptRecord, error) {
	var rec keptRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return keptRecord{}, fmt.Errorf("decode: %w", err)
	}
	if rec.NetNS == "" {
		return keptRecord{}, errors.New(`"netns" is empty`)
	}
	if rec.IfName == "" {
		return keptRecord{}, errors.New(`"ifName" is empty`)
	}
	return rec, nil
}

// keptRecordPath is where ADD records how a container's eth0 was added,
// next to its kept configuration.
func keptRecordPath(containerID string) string {
	return filepath.Join(cacheDir(), "default-network", containerID+".json")
}

// writeKeptRecord records rt, the default network's invocation for the
// container.
func writeKeptRecord(rt *libcni.RuntimeConf) error {
	b, err := json.Marshal(keptRecord{NetNS: rt.NetNS, IfName: rt.IfName, Args: rt.Args, CapabilityArgs: rt.CapabilityArgs})
	if err != nil {
		return err
	}
	return writeFileAtomic(keptRecordPath(rt.ContainerID), b, 0o600)
}

// writeFileAtomic writes b to path through a temporary file in the same
// directory, renamed over path: collection, in another kvnet-cni, reads
// a kept file whole or not at all, never one being written. The
// temporary file's name (".<name>.tmp<random>") has neither of the kept
// files' suffixes, so collection never takes it for an entry.
func writeFileAtomic(path string, b []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, perm)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// gcStatusPath is the collection's status file (gcStatus), for admins.
func gcStatusPath() string { return filepath.Join(cacheDir(), "gc-status.json") }

// gcStatus is the status file: totals since it was made, and the last
// run that failed to collect something.
type gcStatus struct {
	// Collected counts the containers whose default network was deleted
	// by collection (their DEL had not reached kvnet-cni).
	Collected int `json:"collected"`
	// Failures counts the entries a run could not collect (each run
	// that tried and failed counts once).
	Failures        int       `json:"failures"`
	LastFailure     string    `json:"lastFailure,omitempty"`
	LastFailureTime time.Time `json:"lastFailureTime,omitzero"`
	// Pending are the containers collection failed to delete that are
	// still kept (recordStatus); a later run tries them again. One whose
	// own DEL came, or that a later run found live, is dropped.
	Pending []string `json:"pending,omitempty"`
}

// gcCNI is what collection needs of libcni (*libcni.CNIConfig).
type gcCNI interface {
	DelNetworkList(ctx context.Context, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error
	GetCachedAttachments(containerID string) ([]*libcni.NetworkAttachment, error)
}

// gcRun is what one collection did.
type gcRun struct {
	collected []string
	failed    []string // container IDs
	// live are the containers the run found with their netns: nothing
	// of theirs is pending any more.
	live    []string
	lastErr string
}

func (g *gcRun) fail(log io.Writer, id, format string, a ...any) {
	msg := fmt.Sprintf("container %q: ", id) + fmt.Sprintf(format, a...)
	fmt.Fprintf(log, "kvnet-cni: default-network GC: %s\n", msg)
	g.failed = append(g.failed, id)
	g.lastErr = msg
}

// collectKept runs the default network's DEL, with an empty netns, for
// every container kept in dir (but skip, the container of the running
// verb) whose sandbox is gone, and forgets it. It stops when ctx is done;
// what is left is for the next run.
func collectKept(ctx context.Context, dir, skip string, cni gcCNI, log io.Writer) gcRun {
	var run gcRun
	entries, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			fmt.Fprintf(log, "kvnet-cni: default-network GC: %v\n", err)
		}
		return run
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	for _, name := range names {
		id, ok := strings.CutSuffix(name, ".conflist")
		if !ok || id == skip {
			if id, ok := strings.CutSuffix(name, ".json"); ok && id != skip && !slices.Contains(names, id+".conflist") {
				forgetOrphanRecord(dir, id, log)
			}
			continue
		}
		if ctx.Err() != nil {
			fmt.Fprintf(log, "kvnet-cni: default-network GC: out of time, the rest is left for the next run\n")
			break
		}
		// A container whose recorded netns exists is not read further:
		// its sandbox lives, whatever else is kept for it (an ADD may be
		// writing it).
		if b, err := os.ReadFile(filepath.Join(dir, id+".json")); err == nil {
			if rec, err := parseKeptRecord(b); err == nil && !netnsGone(rec.NetNS, log) {
				run.live = append(run.live, id)
				continue
			}
		}
		conf := filepath.Join(dir, name)
		list, err := libcni.ConfListFromFile(conf)
		if err != nil {
			run.fail(log, id, "read the kept configuration %s: %v", conf, err)
			continue
		}
		rec, found, err := keptRecordOf(dir, id, list.Name, cni)
		if err != nil {
			run.fail(log, id, "%v; not collected", err)
			continue
		}
		if !found {
			fmt.Fprintf(log, "kvnet-cni: default-network GC: container %q: %s has no record and libcni's cache no netns for it: whether its sandbox is gone is unknown, not collected\n", id, conf)
			continue
		}
		if !netnsGone(rec.NetNS, log) {
			run.live = append(run.live, id)
			continue
		}
		rt := &libcni.RuntimeConf{ContainerID: id, IfName: rec.IfName, Args: rec.Args, CapabilityArgs: rec.CapabilityArgs}
		if err := cni.DelNetworkList(ctx, list, rt); err != nil {
			run.fail(log, id, "netns %s is gone: DEL of default network %q: %v; tried again next time", rec.NetNS, list.Name, err)
			continue
		}
		for _, p := range []string{conf, filepath.Join(dir, id+".json")} {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				fmt.Fprintf(log, "kvnet-cni: default-network GC: container %q: %v\n", id, err)
			}
		}
		fmt.Fprintf(log, "kvnet-cni: default-network GC: container %q: netns %s is gone and its DEL never came: deleted it from default network %q\n", id, rec.NetNS, list.Name)
		run.collected = append(run.collected, id)
	}
	return run
}

// keptRecordOf returns the record of container id: its file, else, for
// an entry kept before records existed, libcni's cache of network's ADD
// for it (found false when neither has a netns).
func keptRecordOf(dir, id, network string, cni gcCNI) (keptRecord, bool, error) {
	path := filepath.Join(dir, id+".json")
	b, err := os.ReadFile(path)
	if err == nil {
		rec, err := parseKeptRecord(b)
		if err != nil {
			return keptRecord{}, false, fmt.Errorf("record %s: %w", path, err)
		}
		return rec, true, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return keptRecord{}, false, err
	}
	atts, err := cni.GetCachedAttachments(id)
	if err != nil {
		return keptRecord{}, false, nil
	}
	for _, a := range atts {
		if a.Network == network && a.NetNS != "" && a.IfName != "" {
			return keptRecord{NetNS: a.NetNS, IfName: a.IfName, Args: a.CniArgs, CapabilityArgs: a.CapabilityArgs}, true, nil
		}
	}
	return keptRecord{}, false, nil
}

// netnsGone reports whether the netns at path no longer exists. Anything
// but "does not exist" (permissions, ...) counts as there: never collect
// a sandbox that may live.
func netnsGone(path string, log io.Writer) bool {
	_, err := os.Stat(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(log, "kvnet-cni: default-network GC: netns %s: %v; taken as still there\n", path, err)
	}
	return errors.Is(err, fs.ErrNotExist)
}

// forgetOrphanRecord removes the record of a container whose kept
// configuration is gone (a DEL that stopped between the two), once its
// netns is gone too: while it exists, an ADD may be between writing the
// record and the configuration.
func forgetOrphanRecord(dir, id string, log io.Writer) {
	path := filepath.Join(dir, id+".json")
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	if rec, err := parseKeptRecord(b); err == nil && !netnsGone(rec.NetNS, io.Discard) {
		return
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(log, "kvnet-cni: default-network GC: %v\n", err)
	}
}

// recordStatus adds a run to the status file at path. Pending becomes
// what the run failed to collect, and what was pending before that the
// run did not get to (out of time) and kept(id) says is still kept: a
// container the run collected, found live or no longer kept (its DEL
// came) is pending no more. The file is written only when that changes
// something.
func recordStatus(path string, run gcRun, now time.Time, kept func(id string) bool) error {
	var st gcStatus
	if b, err := os.ReadFile(path); err == nil {
		_ = json.Unmarshal(b, &st) // a broken file starts over
	}
	pending := slices.Clone(run.failed)
	for _, id := range st.Pending {
		if !slices.Contains(pending, id) && !slices.Contains(run.collected, id) && !slices.Contains(run.live, id) && kept(id) {
			pending = append(pending, id)
		}
	}
	if len(run.collected) == 0 && len(run.failed) == 0 && slices.Equal(pending, st.Pending) {
		return nil
	}
	st.Collected += len(run.collected)
	st.Failures += len(run.failed)
	st.Pending = pending
	if len(run.failed) > 0 {
		st.LastFailure, st.LastFailureTime = run.lastErr, now.UTC()
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(path, append(b, '\n'), 0o644)
}

// keptIn reports whether dir still keeps container id's configuration.
func keptIn(dir string) func(id string) bool {
	return func(id string) bool {
		_, err := os.Stat(filepath.Join(dir, id+".conflist"))
		return err == nil
	}
}

// collectLostDefaults is collection as a verb runs it: under the lock
// (skipped when another kvnet-cni holds it), within budget, with the
// invocation's CNI_PATH, never failing. It returns after budget and
// gcGrace at most, even when a plugin outlives the budget's kill (a
// child of it keeping its output open holds libcni's wait): the verb
// goes on, and what the collection has not done is for the next run.
func collectLostDefaults(args *skel.CmdArgs, budget time.Duration) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if v := recover(); v != nil {
				fmt.Fprintf(os.Stderr, "kvnet-cni: default-network GC: %v\n", v)
			}
		}()
		collectLocked(args, budget)
	}()
	select {
	case <-done:
	case <-time.After(budget + gcGrace):
		fmt.Fprintf(os.Stderr, "kvnet-cni: default-network GC: still running after %s, left for the next run\n", budget+gcGrace)
	}
}

// collectLocked is collectLostDefaults's work.
func collectLocked(args *skel.CmdArgs, budget time.Duration) {
	dir := filepath.Join(cacheDir(), "default-network")
	if _, err := os.Stat(dir); err != nil {
		return // nothing was ever kept
	}
	lock, err := os.OpenFile(filepath.Join(cacheDir(), "gc.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvnet-cni: default-network GC: %v\n", err)
		return
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return // another kvnet-cni is collecting
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	run := collectKept(ctx, dir, args.ContainerID, cniExec(args), os.Stderr)
	if err := recordStatus(gcStatusPath(), run, time.Now(), keptIn(dir)); err != nil {
		fmt.Fprintf(os.Stderr, "kvnet-cni: default-network GC: status file: %v\n", err)
	}
}
