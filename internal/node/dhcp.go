package node

import (
	"context"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"syscall"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/dhcp"
	"kvnet.io/kvnet/internal/nl"
)

// dhcpServers runs, per local network with a router, a DHCPv4 server (a
// primary network's) and a router advertisement and DHCPv6 server
// (dhcp6.go), in the network's router namespace, on its gateway interface.
type dhcpServers struct {
	node    datapath.NodeConfig
	running map[int]*dhcpServer // network ID -> server
	report  declineReporter     // a guest's DHCPv6 Decline; nil: logged
}

type dhcpServer struct {
	network  string
	serverIP netip.Addr
	prefix6  []netip.Prefix // with mtu and defRoute: what the advertisements say
	mtu      int
	defRoute bool
	nsIno    uint64 // inode of the router namespace it serves in
	leases   *dhcp.StaticLeases
	macs     map[string]bool // MACs set in leases
	cancel   context.CancelFunc
	done     sync.WaitGroup
}

func newDHCPServers(node datapath.NodeConfig) *dhcpServers {
	return &dhcpServers{node: node, running: map[int]*dhcpServer{}}
}

// sync makes the running servers and their leases match want. A server
// whose router namespace was recreated (its socket would listen in a dead
// namespace) is restarted. Failures are logged and retried on the next
// sync; they never stop the datapath.
func (d *dhcpServers) sync(ctx context.Context, want []DHCPNetwork) {
	logger := log.FromContext(ctx)
	keep := map[int]bool{}
	for _, w := range want {
		keep[w.ID] = true
		nsPath := nl.NSPath(datapath.RouterNSName(d.node, w.ID))
		ino, err := inode(nsPath)
		if err != nil {
			logger.Error(err, "DHCP: router namespace not found", "network", w.Network)
			d.stop(w.ID)
			continue
		}
		s := d.running[w.ID]
		if s != nil && (s.nsIno != ino || s.serverIP != w.ServerIP || !slices.Equal(s.prefix6, w.Prefixes6) || s.mtu != w.MTU || s.defRoute != w.DefaultRouter) {
			d.stop(w.ID)
			s = nil
		}
		if s == nil {
			sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
			s = &dhcpServer{network: w.Network, serverIP: w.ServerIP, prefix6: w.Prefixes6, mtu: w.MTU, defRoute: w.DefaultRouter, nsIno: ino,
				leases: dhcp.NewStaticLeases(), macs: map[string]bool{}, cancel: cancel}
			var err error
			if w.ServerIP.IsValid() {
				err = startDHCPv4(sctx, s, w, nsPath, logger)
			}
			if err == nil && len(w.Prefixes6) > 0 {
				err = startDHCPv6(sctx, s, w, nsPath, d.report, logger)
			}
			if err != nil {
				// Both or neither: the next sync retries.
				cancel()
				s.done.Wait()
				logger.Error(err, "DHCP: start server", "network", w.Network)
				continue
			}
			d.running[w.ID] = s
		}
		for mac := range s.macs {
			if _, ok := w.Leases[mac]; !ok {
				hw, _ := net.ParseMAC(mac)
				s.leases.Delete(hw)
				delete(s.macs, mac)
			}
		}
		for mac, l := range w.Leases {
			hw, err := net.ParseMAC(mac)
			if err != nil {
				continue
			}
			s.leases.Set(hw, l)
			s.macs[mac] = true
		}
	}
	for id := range d.running {
		if !keep[id] {
			d.stop(id)
		}
	}
}

// startDHCPv4 opens network w's DHCPv4 server and runs it under s until
// ctx ends.
func startDHCPv4(ctx context.Context, s *dhcpServer, w DHCPNetwork, nsPath string, logger logr.Logger) error {
	srv, err := dhcp.New(dhcp.Config{
		NetNS: nsPath, Interface: datapath.RouterGatewayInterface, ServerIP: w.ServerIP,
		Leases: s.leases, Log: logger.WithValues("network", w.Network),
	})
	if err != nil {
		return err
	}
	s.done.Go(func() {
		if err := srv.Serve(ctx); err != nil && ctx.Err() == nil {
			logger.Error(err, "DHCP server stopped", "network", w.Network)
		}
	})
	logger.Info("DHCP server started", "network", w.Network, "serverIP", w.ServerIP.String())
	return nil
}

func (d *dhcpServers) stop(id int) {
	s := d.running[id]
	if s == nil {
		return
	}
	s.cancel()
	s.done.Wait()
	delete(d.running, id)
}

func (d *dhcpServers) stopAll() {
	for id := range d.running {
		d.stop(id)
	}
}

// inode identifies a namespace: a recreated namespace has a new one.
func inode(path string) (uint64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino, nil
	}
	return 0, nil
}
