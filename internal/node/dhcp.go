package node

import (
	"context"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"

	"sigs.k8s.io/controller-runtime/pkg/log"

	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/dhcp"
	"kvnet.io/kvnet/internal/nl"
)

// dhcpServers runs one DHCP server per local primary network, in the
// network's router namespace, on its gateway interface.
type dhcpServers struct {
	node    datapath.NodeConfig
	running map[int]*dhcpServer // network ID -> server
}

type dhcpServer struct {
	network  string
	serverIP netip.Addr
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
		if s != nil && (s.nsIno != ino || s.serverIP != w.ServerIP) {
			d.stop(w.ID)
			s = nil
		}
		if s == nil {
			leases := dhcp.NewStaticLeases()
			srv, err := dhcp.New(dhcp.Config{
				NetNS: nsPath, Interface: datapath.RouterGatewayInterface, ServerIP: w.ServerIP,
				Leases: leases, Log: logger.WithValues("network", w.Network),
			})
			if err != nil {
				logger.Error(err, "DHCP: start server", "network", w.Network)
				continue
			}
			sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
			s = &dhcpServer{network: w.Network, serverIP: w.ServerIP, nsIno: ino, leases: leases, macs: map[string]bool{}, cancel: cancel}
			s.done.Go(func() {
				if err := srv.Serve(sctx); err != nil && sctx.Err() == nil {
					logger.Error(err, "DHCP server stopped", "network", w.Network)
				}
			})
			d.running[w.ID] = s
			logger.Info("DHCP server started", "network", w.Network, "serverIP", w.ServerIP.String())
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
