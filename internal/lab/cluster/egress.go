package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"kvnet.io/kvnet/internal/reserved"
)

// The egress scenario asks where a pod's connection to the outside left
// from. Both ways out of a primary-UDN pod end in the node's masquerade
// (kvnet's router masquerades to its transit address and the node again
// to its own; Flannel's --ip-masq masquerades the pod IP to the node's),
// so the address the outside sees is the node's either way. What tells
// the two apart is the address the node translated: the node's
// conntrack entry for the very connection the outside saw. The egress
// server (on this host, outside the cluster) reads it while the
// connection is open and answers it with both.

// egressReport is the egress server's answer: the client's address as
// the server sees it, and the source the client's node translated to
// it (its conntrack entry's original source).
type egressReport struct {
	Seen   string `json:"seen"`
	Origin string `json:"origin,omitempty"`
	Err    string `json:"error,omitempty"`
}

// egressServer serves egressReports on a host address outside the
// cluster.
type egressServer struct {
	srv *http.Server
	// URL is the server's URL; the client adds ?node=<its node>.
	URL string
}

// startEgressServer listens on addr (port 0: any) and answers every
// request with an egressReport, looking the connection up in the
// conntrack table of the network namespace nodeNetns returns for the
// request's node parameter.
func startEgressServer(addr netip.Addr, nodeNetns func(node string) (string, error)) (*egressServer, error) {
	ln, err := net.Listen("tcp4", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		return nil, fmt.Errorf("egress server: listen on %s: %w", addr, err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rep := egressReport{Seen: r.RemoteAddr}
		if err := rep.lookup(r, nodeNetns); err != nil {
			rep.Err = err.Error()
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(rep)
	})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return &egressServer{srv: srv, URL: "http://" + ln.Addr().String() + "/"}, nil
}

func (rep *egressReport) lookup(r *http.Request, nodeNetns func(string) (string, error)) error {
	seen, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return fmt.Errorf("client address %q: %w", r.RemoteAddr, err)
	}
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return errors.New("no local address for the request")
	}
	server, err := netip.ParseAddrPort(local.String())
	if err != nil {
		return fmt.Errorf("server address %q: %w", local, err)
	}
	node := r.URL.Query().Get("node")
	if nodeNetns == nil {
		return errors.New("no way to read the nodes' conntrack tables (ScenarioTarget.NodeNetns)")
	}
	path, err := nodeNetns(node)
	if err != nil {
		return err
	}
	flows, err := conntrackFlows(path)
	if err != nil {
		return fmt.Errorf("node %q: %w", node, err)
	}
	origin, ok := flowOrigin(flows, seen, server)
	if !ok {
		return fmt.Errorf("node %q: no conntrack entry whose reply goes from %s to %s (%d entries)", node, server, seen, len(flows))
	}
	rep.Origin = origin.String()
	return nil
}

func (e *egressServer) Close() error { return e.srv.Close() }

// conntrackFlows lists the IPv4 conntrack table of the network namespace
// at path.
func conntrackFlows(path string) ([]*netlink.ConntrackFlow, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", path, err)
	}
	defer h.Close()
	flows, err := h.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, fmt.Errorf("conntrack table of %s: %w", path, err)
	}
	return flows, nil
}

// flowOrigin finds the TCP flow whose reply comes from server to seen
// (the connection as the server saw it, after the node's translation)
// and returns its original source address: what the node translated.
func flowOrigin(flows []*netlink.ConntrackFlow, seen, server netip.AddrPort) (netip.Addr, bool) {
	for _, f := range flows {
		if f == nil || f.Reverse.Protocol != unix.IPPROTO_TCP {
			continue
		}
		src, ok1 := netip.AddrFromSlice(f.Reverse.SrcIP)
		dst, ok2 := netip.AddrFromSlice(f.Reverse.DstIP)
		if !ok1 || !ok2 {
			continue
		}
		if netip.AddrPortFrom(src.Unmap(), f.Reverse.SrcPort) != server || netip.AddrPortFrom(dst.Unmap(), f.Reverse.DstPort) != seen {
			continue
		}
		o, ok := netip.AddrFromSlice(f.Forward.SrcIP)
		if !ok {
			return netip.Addr{}, false
		}
		return o.Unmap(), true
	}
	return netip.Addr{}, false
}

// Egress paths out of a pod, as its node's conntrack tells them.
const (
	egressUDN  = "udn"  // through its network's router: the node translated the router's transit address
	egressEth0 = "eth0" // through eth0, the default network: the node translated the pod IP
)

// transitSubnets are the subnets kvnet's routers masquerade to before
// the node (kvnet-node's --masquerade-subnets, default).
var transitSubnets = func() []netip.Prefix {
	s, err := reserved.Parse(reserved.DefaultMasquerade, reserved.DefaultJoin, reserved.DefaultTransit)
	if err != nil {
		panic(err)
	}
	return s.Masquerade
}()

// egressPath says which way a connection left a pod whose eth0 holds
// eth0, from the original source origin its node translated: egressUDN
// (a router's transit address), egressEth0 (the pod IP), or an error
// naming what it is.
func egressPath(origin, eth0 netip.Addr) (string, error) {
	if origin == eth0 {
		return egressEth0, nil
	}
	for _, p := range transitSubnets {
		if p.Contains(origin) {
			return egressUDN, nil
		}
	}
	return "", fmt.Errorf("source %s before the node's translation is neither the pod IP %s (eth0) nor in kvnet's transit subnets %v", origin, eth0, transitSubnets)
}

// parseEgressReport reads the egress server's answer.
func parseEgressReport(body string) (egressReport, netip.AddrPort, netip.Addr, error) {
	var rep egressReport
	if err := json.Unmarshal([]byte(strings.TrimSpace(body)), &rep); err != nil {
		return rep, netip.AddrPort{}, netip.Addr{}, fmt.Errorf("egress server's answer %q: %w", body, err)
	}
	seen, err := netip.ParseAddrPort(rep.Seen)
	if err != nil {
		return rep, netip.AddrPort{}, netip.Addr{}, fmt.Errorf("egress server's answer %q: seen: %w", body, err)
	}
	if rep.Err != "" {
		return rep, seen, netip.Addr{}, fmt.Errorf("egress server saw %s: %s", seen, rep.Err)
	}
	origin, err := netip.ParseAddr(rep.Origin)
	if err != nil {
		return rep, seen, netip.Addr{}, fmt.Errorf("egress server's answer %q: origin: %w", body, err)
	}
	return rep, seen, origin, nil
}

// nodeNetnsPath returns the network namespace of the lab's node named
// node (NodeName(i)): the egress server reads its conntrack table there.
func nodeNetnsPath(node string) (string, error) {
	var i int
	if _, err := fmt.Sscanf(node, "node-%d", &i); err != nil || NodeName(i) != node {
		return "", fmt.Errorf("node %q is not a lab node (node-<i>)", node)
	}
	return "/run/netns/" + Netns(i), nil
}

// fetchEgress makes pod p fetch the egress server's URL and returns
// what the server saw and what the node translated.
func (s *scenarios) fetchEgress(ctx context.Context, p *scenarioPod, srv *egressServer) (netip.AddrPort, netip.Addr, error) {
	url := srv.URL + "?node=" + p.pod.Spec.NodeName
	var seen netip.AddrPort
	var origin netip.Addr
	err := poll(ctx, reachTimeout, func(ctx context.Context) error {
		out, errOut, err := s.fetch(ctx, p, url, reachTry)
		if err != nil {
			return fmt.Errorf("%s: httpget %s: %v: %s", p, url, err, strings.TrimSpace(errOut))
		}
		_, seen, origin, err = parseEgressReport(out)
		return err
	})
	return seen, origin, err
}
