package cni

// kvnet-node's socket: the fast way for ADD to learn its allocation.
//
// kvnet-node already watches every pod of its node, so it answers
// kvnet-cni's question — "the allocation of pod P for network N" — from
// its cache, over a Unix socket next to its status file, and waits there
// (bounded by the request) for the allocation to arrive. ADD then
// neither loads a kubeconfig, nor makes a TLS connection, nor asks the
// API server anything (docs/datapath.md, "kvnet-cni").
//
// When the socket is absent or refuses (kvnet-node not running, or still
// syncing its caches), ADD reads the pod from the API server as before:
// a kvnet-node restart slows pod creation down, never fails it.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"kvnet.io/kvnet/internal/podnetworks"
)

// SocketName is the name of kvnet-node's socket, in the directory of its
// status file (/run/kvnet/cni.sock by default).
const SocketName = "cni.sock"

// attachmentPath is the one request the socket serves.
const attachmentPath = "/v1/attachment"

// AttachmentQuery asks for a pod's allocation for one network.
type AttachmentQuery struct {
	Namespace, Name string
	// UID is the pod's (CNI_ARGS K8S_POD_UID); a cached pod of another UID
	// (an earlier pod of the same name) is not the one asked for.
	UID string
	// NAD is the network attachment definition's key ("ns/name") when the
	// configuration names it; Network the network's name otherwise.
	NAD, Network string
	// Timeout bounds the wait for the allocation.
	Timeout time.Duration
}

func (q AttachmentQuery) values() url.Values {
	v := url.Values{}
	v.Set("namespace", q.Namespace)
	v.Set("name", q.Name)
	v.Set("uid", q.UID)
	v.Set("nad", q.NAD)
	v.Set("network", q.Network)
	v.Set("timeout", q.Timeout.String())
	return v
}

func parseQuery(v url.Values) (AttachmentQuery, error) {
	q := AttachmentQuery{Namespace: v.Get("namespace"), Name: v.Get("name"), UID: v.Get("uid"), NAD: v.Get("nad"), Network: v.Get("network")}
	if q.Namespace == "" || q.Name == "" {
		return q, fmt.Errorf("query %q: namespace and name are required", v.Encode())
	}
	if q.NAD == "" && q.Network == "" {
		return q, fmt.Errorf("query %q: nad or network is required", v.Encode())
	}
	t, err := time.ParseDuration(v.Get("timeout"))
	if err != nil || t <= 0 {
		return q, fmt.Errorf("query: timeout %q is not a positive duration", v.Get("timeout"))
	}
	q.Timeout = min(t, 5*time.Minute)
	return q, nil
}

// match picks a network's entry: by NAD key when given, else by network
// name (hand-written and IPAM-only NADs).
func match(nets podnetworks.Networks, nad, network string) (podnetworks.Attachment, bool) {
	if nad != "" {
		if a, ok := nets[nad]; ok {
			return a, true
		}
	}
	for _, a := range nets {
		if a.Network == network {
			return a, true
		}
	}
	return podnetworks.Attachment{}, false
}

// PodState is what the node's cache holds of a pod.
type PodState struct {
	UID string
	// Networks is its kvnet.io/pod-networks annotation ("" when none).
	Networks string
}

// NodeServer answers kvnet-cni on kvnet-node's socket from kvnet-node's
// pod cache.
type NodeServer struct {
	// Lookup reads a pod from the cache; ok is false when it is not there.
	Lookup func(ctx context.Context, namespace, name string) (st PodState, ok bool, err error)
	// Observe, when set, is told each answer's outcome ("found",
	// "timeout", "error") and how long it took.
	Observe func(outcome string, d time.Duration)

	mu      sync.Mutex
	waiters map[string][]chan struct{} // by namespace/name
}

// PodChanged wakes the requests waiting for pod namespace/name. kvnet-node
// calls it on every event of a pod of its node.
func (s *NodeServer) PodChanged(namespace, name string) {
	key := namespace + "/" + name
	s.mu.Lock()
	ws := s.waiters[key]
	delete(s.waiters, key)
	s.mu.Unlock()
	for _, w := range ws {
		close(w)
	}
}

// wait returns a channel closed at the next PodChanged of the pod.
func (s *NodeServer) wait(key string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiters == nil {
		s.waiters = map[string][]chan struct{}{}
	}
	c := make(chan struct{})
	s.waiters[key] = append(s.waiters[key], c)
	return c
}

// forget drops a request's channel when it stops waiting.
func (s *NodeServer) forget(key string, c <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := s.waiters[key]
	for i, w := range ws {
		if w == c {
			s.waiters[key] = append(ws[:i:i], ws[i+1:]...)
			break
		}
	}
	if len(s.waiters[key]) == 0 {
		delete(s.waiters, key)
	}
}

// errNoAllocation: the pod has no allocation for the network (yet).
var errNoAllocation = errors.New("no allocation")

// attachment returns the pod's allocation for the query's network,
// waiting for it until the query's timeout or ctx ends.
func (s *NodeServer) attachment(ctx context.Context, q AttachmentQuery) (podnetworks.Attachment, error) {
	ctx, cancel := context.WithTimeout(ctx, q.Timeout)
	defer cancel()
	key := q.Namespace + "/" + q.Name
	for {
		// Register first, then look: an event between the two still wakes.
		changed := s.wait(key)
		a, why, err := s.lookup(ctx, q)
		if err == nil || !errors.Is(err, errNoAllocation) {
			s.forget(key, changed)
			return a, err
		}
		select {
		case <-changed:
		case <-ctx.Done():
			s.forget(key, changed)
			return podnetworks.Attachment{}, fmt.Errorf("%w after %s: %s", errNoAllocation, q.Timeout, why)
		}
	}
}

// lookup looks once; with errNoAllocation it says why.
func (s *NodeServer) lookup(ctx context.Context, q AttachmentQuery) (podnetworks.Attachment, string, error) {
	st, ok, err := s.Lookup(ctx, q.Namespace, q.Name)
	switch {
	case err != nil:
		return podnetworks.Attachment{}, "", err
	case !ok:
		return podnetworks.Attachment{}, "kvnet-node has not seen the pod", errNoAllocation
	case q.UID != "" && st.UID != q.UID:
		return podnetworks.Attachment{}, fmt.Sprintf("kvnet-node has a pod of that name with UID %s, not %s", st.UID, q.UID), errNoAllocation
	case st.Networks == "":
		return podnetworks.Attachment{}, "the pod has no " + podnetworks.Annotation + " annotation", errNoAllocation
	}
	nets, err := podnetworks.Parse(st.Networks)
	if err != nil {
		return podnetworks.Attachment{}, "", fmt.Errorf("annotation %s: %w", podnetworks.Annotation, err)
	}
	a, found := match(nets, q.NAD, q.Network)
	if !found {
		return podnetworks.Attachment{}, fmt.Sprintf("annotation %s has no entry for network %q", podnetworks.Annotation, q.Network), errNoAllocation
	}
	return a, "", nil
}

// nodeReply is the socket's answer: the attachment, or why there is none.
type nodeReply struct {
	Attachment *podnetworks.Attachment `json:"attachment,omitempty"`
	Error      string                  `json:"error,omitempty"`
}

// ServeHTTP serves GET /v1/attachment?namespace=&name=&uid=&nad=&network=&timeout=.
func (s *NodeServer) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	start := time.Now()
	reply := func(code int, r nodeReply, outcome string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(r)
		if s.Observe != nil {
			s.Observe(outcome, time.Since(start))
		}
	}
	if req.URL.Path != attachmentPath || req.Method != http.MethodGet {
		reply(http.StatusNotFound, nodeReply{Error: req.Method + " " + req.URL.Path + ": not served"}, "error")
		return
	}
	q, err := parseQuery(req.URL.Query())
	if err != nil {
		reply(http.StatusBadRequest, nodeReply{Error: err.Error()}, "error")
		return
	}
	a, err := s.attachment(req.Context(), q)
	switch {
	case err == nil:
		reply(http.StatusOK, nodeReply{Attachment: &a}, "found")
	case errors.Is(err, errNoAllocation):
		reply(http.StatusNotFound, nodeReply{Error: err.Error()}, "timeout")
	default:
		reply(http.StatusInternalServerError, nodeReply{Error: err.Error()}, "error")
	}
}

// Serve listens on the socket at path (replacing a stale one, mode 0600)
// and serves until ctx ends, then removes it.
func (s *NodeServer) Serve(ctx context.Context, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	var l net.Listener
	err := withSocketAddr(path, func(addr string) (err error) {
		l, err = net.Listen("unix", addr)
		return err
	})
	if err != nil {
		return err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return err
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	err = srv.Serve(l)
	_ = os.Remove(path)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// maxSocketPath is the longest path a Unix socket address holds (108
// bytes with its terminating NUL).
const maxSocketPath = 107

// withSocketAddr calls f with an address for the socket at path: path
// itself, or, when it is too long for a socket address (a deep state
// directory), the same file through /proc/self/fd and a descriptor of
// its directory.
func withSocketAddr(path string, f func(addr string) error) error {
	if len(path) <= maxSocketPath {
		return f(path)
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer dir.Close()
	return f(fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path)))
}

// errNodeUnavailable: nobody answers on kvnet-node's socket; ADD reads
// the API server instead.
var errNodeUnavailable = errors.New("kvnet-node's socket does not answer")

// askNode asks kvnet-node's socket at path for q's allocation.
func askNode(ctx context.Context, path string, q AttachmentQuery) (podnetworks.Attachment, error) {
	// Dial once here: a socket file without a listener refuses at once.
	var d net.Dialer
	var conn net.Conn
	err := withSocketAddr(path, func(addr string) (err error) {
		conn, err = d.DialContext(ctx, "unix", addr)
		return err
	})
	if err != nil {
		return podnetworks.Attachment{}, fmt.Errorf("%w: %v", errNodeUnavailable, err)
	}
	used := false
	tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
		if used {
			return nil, errors.New("one connection per request")
		}
		used = true
		return conn, nil
	}}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://kvnet-node"+attachmentPath+"?"+q.values().Encode(), nil)
	if err != nil {
		conn.Close()
		return podnetworks.Attachment{}, err
	}
	// A connection that breaks before the answer (kvnet-node stopping
	// while the request waits) is kvnet-node going away: unavailable, so
	// that ADD reads the API server; only a deadline of ours ends it.
	broken := func(err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("ask kvnet-node at %s: %w", path, err)
		}
		return fmt.Errorf("%w: %s: %v", errNodeUnavailable, path, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return podnetworks.Attachment{}, broken(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return podnetworks.Attachment{}, broken(err)
	}
	var r nodeReply
	if err := json.Unmarshal(body, &r); err != nil {
		return podnetworks.Attachment{}, fmt.Errorf("ask kvnet-node at %s: %s: decode %q: %w", path, resp.Status, body, err)
	}
	switch {
	case resp.StatusCode == http.StatusOK && r.Attachment != nil:
		return *r.Attachment, nil
	case resp.StatusCode == http.StatusNotFound:
		return podnetworks.Attachment{}, fmt.Errorf("%w: kvnet-node: %s", errNoAllocation, r.Error)
	default:
		return podnetworks.Attachment{}, fmt.Errorf("ask kvnet-node at %s: %s: %s", path, resp.Status, r.Error)
	}
}
