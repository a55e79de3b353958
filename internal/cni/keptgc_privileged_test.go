package cni_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/cni/libcni"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/testenv"
)

// TestCollectLostDefaultNetwork: kvnet-cni as the pods' default network
// (multus-default), the node's default network the upstream bridge and
// host-local plugins. Pod a's DEL is lost: its netns goes without one.
// The next ADD on the node (pod b) deletes a from the default network
// (host-local's lease of a is released) and forgets a's kept
// configuration and record, and b is added; pod c, whose netns is still
// there, keeps its lease and kept files. Then pod d's DEL is lost with a
// default network whose DEL fails: the next ADD (pod e) still succeeds,
// d's lease and kept files stay and the status file counts the failure;
// once the plugin works, the next DEL on the node (e's) collects d. Pod
// f's DEL is lost with a default network whose DEL hangs: the next ADD
// (pod g) returns all the same, f's entry left for the next time.
func TestCollectLostDefaultNetwork(t *testing.T) {
	testenv.NeedsFixture(t, cniCfg != nil)
	ctx := context.Background()
	const ns = "cni-lostdel"
	f := newDefaultNetFixture(ctx, t, ns, "kvgcbr0", "10.74.0.0/24", "10.75.0.0/24", false)
	hostLocal, cacheDir, conf, bridge := f.hostLocal, f.cacheDir, f.conf, f.plugin
	conf["args"] = map[string]any{"cni": map[string]any{multus.AttachDefaultNetworkArg: true}}
	config, _ := json.Marshal(conf)
	list := confList(t, string(config))

	pods := []string{"a", "b", "c", "d", "e", "f", "g"}
	for _, p := range pods {
		create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}})
	}
	for _, p := range pods {
		testenv.Eventually(t, waitTimeout, "primary allocation of "+p, func() error {
			var pod corev1.Pod
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: p}, &pod); err != nil {
				return err
			}
			nets, err := podnetworks.Parse(pod.Annotations[podnetworks.Annotation])
			if err != nil {
				return err
			}
			if _, ok := nets[ns+"/net"]; !ok {
				return fmt.Errorf("no entry for %s/net in %v", ns, nets)
			}
			return nil
		})
	}

	ctr := func(pod string) string { return "ctr-gc-" + pod }
	rts := map[string]*libcni.RuntimeConf{}
	add := func(pod string) {
		t.Helper()
		r := rt(ns, pod, netnsFor(t), ctr(pod), "eth0")
		rts[pod] = r
		if _, err := cniCfg.AddNetworkList(ctx, list, r); err != nil {
			t.Fatalf("ADD of pod %s: %v", pod, err)
		}
		t.Cleanup(func() { _ = cniCfg.DelNetworkList(ctx, list, r) })
	}
	// loseDel removes the pod's netns as the runtime does after DEL,
	// without the DEL.
	loseDel := func(pod string) {
		t.Helper()
		if err := nl.DeleteNamedNS(filepath.Base(rts[pod].NetNS)); err != nil {
			t.Fatal(err)
		}
	}
	// held reports which pods hold a lease in host-local.
	held := func() []string {
		t.Helper()
		files, err := filepath.Glob(filepath.Join(hostLocal, "defnet", "10.74.0.*"))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			id, _, _ := strings.Cut(string(b), "\r\n")
			out = append(out, strings.TrimPrefix(strings.TrimSpace(id), "ctr-gc-"))
		}
		slices.Sort(out)
		return out
	}
	kept := func(pod string) []string {
		t.Helper()
		files, _ := filepath.Glob(filepath.Join(cacheDir, "default-network", ctr(pod)+".*"))
		return files
	}
	gcStatus := func() (st struct {
		Collected, Failures int
		LastFailure         string
		Pending             []string
	}) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(cacheDir, "gc-status.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		return st
	}

	add("a")
	add("c")
	if got := held(); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("leases of %v after a's and c's ADD, want [a c]", got)
	}
	if got := kept("a"); len(got) != 2 {
		t.Fatalf("kept for a: %v, want its configuration and record", got)
	}
	loseDel("a")
	add("b")
	if got := held(); !slices.Equal(got, []string{"b", "c"}) {
		t.Errorf("leases of %v after b's ADD, want [b c]: a's netns is gone and its DEL never came", got)
	}
	if got := kept("a"); len(got) != 0 {
		t.Errorf("kept for a after it was collected: %v", got)
	}
	if got := kept("c"); len(got) != 2 {
		t.Errorf("kept for c, whose netns is there: %v, want its configuration and record", got)
	}
	if st := gcStatus(); st.Collected != 1 || st.Failures != 0 {
		t.Errorf("status file: %+v, want 1 collected, no failure", st)
	}
	h, err := nl.NewHandle(rts["b"].NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, name := range []string{"eth0", multus.PrimaryInterface} {
		if _, err := h.LinkByName(name); err != nil {
			t.Errorf("pod b has no %s after the ADD that collected a: %v", name, err)
		}
	}

	// A default network whose DEL fails: d's kept configuration chains
	// a plugin that fails every DEL after the bridge.
	failing := filepath.Join(binDir, "kvnet-test-gcfail")
	script := "#!/bin/sh\necho '{\"cniVersion\":\"1.0.0\",\"code\":999,\"msg\":\"kvnet test: DEL fails\"}'\nexit 1\n"
	if err := os.WriteFile(failing, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(failing) })
	add("d")
	if err := os.WriteFile(filepath.Join(cacheDir, "default-network", ctr("d")+".conflist"),
		[]byte(`{"cniVersion":"1.0.0","name":"defnet","plugins":[`+bridge+`,{"type":"kvnet-test-gcfail"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	loseDel("d")
	add("e") // fails the test if the collection's failure fails it
	if got := held(); !slices.Equal(got, []string{"b", "c", "d", "e"}) {
		t.Errorf("leases of %v after e's ADD, want [b c d e]: d's DEL fails", got)
	}
	if got := kept("d"); len(got) != 2 {
		t.Errorf("kept for d after its DEL failed: %v, want its configuration and record for the next time", got)
	}
	if st := gcStatus(); st.Failures != 1 || !slices.Equal(st.Pending, []string{ctr("d")}) || !strings.Contains(st.LastFailure, "kvnet test: DEL fails") {
		t.Errorf("status file: %+v, want 1 failure, d pending, the plugin's message", st)
	}

	// The plugin works again: the next DEL on the node collects d.
	if err := os.WriteFile(failing, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := cniCfg.DelNetworkList(ctx, list, rts["e"]); err != nil {
		t.Fatalf("DEL of e: %v", err)
	}
	if got := held(); !slices.Equal(got, []string{"b", "c"}) {
		t.Errorf("leases of %v after e's DEL, want [b c]: d's DEL works again", got)
	}
	if got := kept("d"); len(got) != 0 {
		t.Errorf("kept for d after it was collected: %v", got)
	}
	if st := gcStatus(); st.Collected != 2 || len(st.Pending) != 0 {
		t.Errorf("status file: %+v, want 2 collected, none pending", st)
	}

	// A default network whose DEL hangs, in a child that keeps the
	// plugin's output open after the plugin is killed: pod g's ADD
	// returns while that child still runs, f's entry stays.
	pidFile := filepath.Join(t.TempDir(), "hung.pid")
	hanging := filepath.Join(binDir, "kvnet-test-gchang")
	if err := os.WriteFile(hanging, []byte("#!/bin/sh\nsleep 60 &\necho $! > "+pidFile+"\nwait\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(hanging) })
	add("f")
	if err := os.WriteFile(filepath.Join(cacheDir, "default-network", ctr("f")+".conflist"),
		[]byte(`{"cniVersion":"1.0.0","name":"defnet","plugins":[`+bridge+`,{"type":"kvnet-test-gchang"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	loseDel("f")
	add("g")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the hanging plugin did not run: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	// /proc/<pid>/stat: "pid (comm) state ..."; an ended child not yet
	// reaped is a zombie (Z).
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	_, rest, _ := strings.Cut(string(stat), ") ")
	if err != nil || !strings.Contains(string(stat), "(sleep)") || strings.HasPrefix(rest, "Z") || strings.HasPrefix(rest, "X") {
		t.Errorf("the hung plugin's child (pid %d) had ended when g's ADD returned (%q, %v): the ADD waited for it", pid, stat, err)
	} else {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if got := kept("f"); len(got) != 2 {
		t.Errorf("kept for f after its DEL hung: %v, want its configuration and record for the next time", got)
	}
	// The cleanup's DELs must not hang on it.
	if err := os.WriteFile(hanging, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}
