package cni

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakePods is the pod cache seam of NodeServer: a map under a lock.
type fakePods struct {
	mu   sync.Mutex
	pods map[string]PodState
}

func (f *fakePods) lookup(_ context.Context, ns, name string) (PodState, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.pods[ns+"/"+name]
	return st, ok, nil
}

func (f *fakePods) set(key string, st PodState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pods[key] = st
}

const sockAnnotation = `{"ns/net1":{"ip_addresses":["10.1.0.5/24"],"mac_address":"0a:58:0a:01:00:05","role":"secondary","network":"tenant-net"}}`

// serveNode runs a NodeServer on a socket under dir until the test ends.
func serveNode(t *testing.T, dir string, pods *fakePods) (*NodeServer, string) {
	t.Helper()
	s := &NodeServer{Lookup: pods.lookup}
	path := filepath.Join(dir, SocketName)
	stop := startNode(t, s, path)
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("serve: %v", err)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket %s left behind: %v", path, err)
		}
	})
	return s, path
}

// startNode serves s at path and returns once the socket answers; stop
// ends the server and returns Serve's error.
func startNode(t *testing.T, s *NodeServer, path string) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, path) }()
	stop = func() error {
		cancel()
		return <-done
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := askNode(context.Background(), path, AttachmentQuery{Namespace: "probe", Name: "probe", Network: "n", Timeout: time.Millisecond})
		if !errors.Is(err, errNodeUnavailable) {
			return stop
		}
		if time.Now().After(deadline) {
			_ = stop()
			t.Fatalf("socket %s never answered: %v", path, err)
		}
		time.Sleep(10 * time.Millisecond) // polling for Serve's listener, bounded by the deadline
	}
}

func query(uid string, timeout time.Duration) AttachmentQuery {
	return AttachmentQuery{Namespace: "ns", Name: "p", UID: uid, NAD: "ns/net1", Network: "tenant-net", Timeout: timeout}
}

// TestNodeSocketAnswersFromCache: the allocation in the cache comes back
// at once; by NAD key or by network name.
func TestNodeSocketAnswersFromCache(t *testing.T) {
	pods := &fakePods{pods: map[string]PodState{"ns/p": {UID: "u1", Networks: sockAnnotation}}}
	_, path := serveNode(t, t.TempDir(), pods)
	for _, q := range []AttachmentQuery{query("u1", 5*time.Second), {Namespace: "ns", Name: "p", Network: "tenant-net", Timeout: time.Second}} {
		a, err := askNode(context.Background(), path, q)
		if err != nil {
			t.Fatalf("%+v: %v", q, err)
		}
		if a.MACAddress != "0a:58:0a:01:00:05" || len(a.IPAddresses) != 1 || a.IPAddresses[0] != "10.1.0.5/24" {
			t.Errorf("%+v: attachment %+v", q, a)
		}
	}
}

// TestNodeSocketWaitsForTheAllocation: a request for a pod whose
// allocation is not there yet (no pod, an earlier pod's UID, no entry)
// is answered when the cache changes; one that never comes times out
// with why.
func TestNodeSocketWaitsForTheAllocation(t *testing.T) {
	pods := &fakePods{pods: map[string]PodState{"ns/p": {UID: "old", Networks: sockAnnotation}}}
	s, path := serveNode(t, t.TempDir(), pods)

	got := make(chan error, 1)
	go func() {
		_, err := askNode(context.Background(), path, query("new", time.Minute))
		got <- err
	}()
	// Until the pod of UID "new" is cached, the answer waits; a change of
	// another pod does not answer it.
	waitForWaiter(t, s, "ns/p")
	s.PodChanged("ns", "other")
	pods.set("ns/p", PodState{UID: "new"})
	s.PodChanged("ns", "p")
	waitForWaiter(t, s, "ns/p")
	select {
	case err := <-got:
		t.Fatalf("answered before the allocation: %v", err)
	default:
	}
	pods.set("ns/p", PodState{UID: "new", Networks: sockAnnotation})
	s.PodChanged("ns", "p")
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("no answer after the allocation arrived")
	}

	_, err := askNode(context.Background(), path, AttachmentQuery{Namespace: "ns", Name: "p", UID: "new", Network: "other-net", Timeout: 50 * time.Millisecond})
	if !errors.Is(err, errNoAllocation) || !strings.Contains(err.Error(), `no entry for network "other-net"`) {
		t.Errorf("missing network: %v", err)
	}
	_, err = askNode(context.Background(), path, AttachmentQuery{Namespace: "ns", Name: "gone", Network: "tenant-net", Timeout: 50 * time.Millisecond})
	if !errors.Is(err, errNoAllocation) || !strings.Contains(err.Error(), "has not seen the pod") {
		t.Errorf("missing pod: %v", err)
	}
	s.mu.Lock()
	left := len(s.waiters)
	s.mu.Unlock()
	if left != 0 {
		t.Errorf("%d waiters left after every request ended", left)
	}
}

// waitForWaiter returns once a request waits for pod key.
func waitForWaiter(t *testing.T, s *NodeServer, key string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s.mu.Lock()
		n := len(s.waiters[key])
		s.mu.Unlock()
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no request waits for %s", key)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, bounded by the deadline
	}
}

// TestNodeSocketUnavailable: no socket, or a socket file nobody listens
// on, is errNodeUnavailable (ADD reads the API server instead).
func TestNodeSocketUnavailable(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, SocketName)
	if _, err := askNode(context.Background(), path, query("", time.Second)); !errors.Is(err, errNodeUnavailable) {
		t.Errorf("no socket: %v", err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if _, err := askNode(context.Background(), path, query("", time.Second)); !errors.Is(err, errNodeUnavailable) {
		t.Errorf("stale socket: %v", err)
	}
}

// TestNodeSocketLongPath: a state directory deeper than a socket address
// holds still serves (through /proc/self/fd).
func TestNodeSocketLongPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	pods := &fakePods{pods: map[string]PodState{"ns/p": {Networks: sockAnnotation}}}
	s := &NodeServer{Lookup: pods.lookup}
	path := filepath.Join(dir, SocketName)
	if len(path) <= maxSocketPath {
		t.Fatalf("test setup: %s is short", path)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, path) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := askNode(context.Background(), path, query("", time.Second))
		if err == nil {
			break
		}
		if !errors.Is(err, errNodeUnavailable) || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond) // polling for Serve's listener, bounded by the deadline
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket %s: %v, mode %v; want 0600", path, err, fi.Mode())
	}
}

// TestNodeSocketBadQuery: a request without the pod or the network is
// refused naming what is missing.
func TestNodeSocketBadQuery(t *testing.T) {
	pods := &fakePods{pods: map[string]PodState{}}
	_, path := serveNode(t, t.TempDir(), pods)
	for q, want := range map[AttachmentQuery]string{
		{Name: "p", Network: "n", Timeout: time.Second}:        "namespace and name are required",
		{Namespace: "ns", Name: "p", Timeout: time.Second}:     "nad or network is required",
		{Namespace: "ns", Name: "p", Network: "n", Timeout: 0}: `timeout "0s" is not a positive duration`,
	} {
		_, err := askNode(context.Background(), path, q)
		if err == nil || errors.Is(err, errNoAllocation) || errors.Is(err, errNodeUnavailable) || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v, want an error containing %q", q, err, want)
		}
	}
}

// TestNodeSocketStopsMidRequest: kvnet-node stopping while a request
// waits leaves it unavailable (ADD then reads the API server), not a
// failed ADD.
func TestNodeSocketStopsMidRequest(t *testing.T) {
	pods := &fakePods{pods: map[string]PodState{}}
	s := &NodeServer{Lookup: pods.lookup}
	path := filepath.Join(t.TempDir(), SocketName)
	stop := startNode(t, s, path)
	got := make(chan error, 1)
	go func() {
		_, err := askNode(context.Background(), path, query("", time.Minute))
		got <- err
	}()
	waitForWaiter(t, s, "ns/p")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if !errors.Is(err, errNodeUnavailable) {
			t.Errorf("request cut by kvnet-node stopping: %v, want errNodeUnavailable", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the waiting request did not end when the server stopped")
	}
}
