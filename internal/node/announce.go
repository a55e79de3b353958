package node

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/nl"
)

// ethPRARP is RARP's ether type: QEMU announces a migrated guest with RARP
// frames as soon as it runs on the target.
const ethPRARP = 0x8035

// announcements watches the Standby ports of migration targets on this
// node for the guest's first frame there (its first IP packet or QEMU's
// announce, whichever comes first). On it, it opens the port at once
// (activate: the port's own rules, nothing else) and remembers the MAC, so
// that the next plan also has the port off Standby, without waiting for
// the API to say the migration completed.
type announcements struct {
	netns    string // the datapath's network namespace ("" is ours)
	activate func(datapath.Port) error
	kick     func()
	log      logr.Logger
	// opened is told of each port opened at its guest's first frame:
	// what the frame was, when it came and when the port was open.
	opened func(p datapath.Port, frame string, at, open time.Time)

	mu        sync.Mutex
	watching  map[string]*os.File // standby host interface -> packet socket
	announced map[string]bool     // MAC -> its guest announced itself here
	// neighbours are Plan.Neighbours: what a Standby port's ARP requests
	// are answered from.
	neighbours map[string]map[netip.Addr]net.HardwareAddr
	// probeFrom are Plan.ProbeFrom: the gateway each network's standby
	// probes come from (none: no probes on that network).
	probeFrom map[string]Gateway
	// probing holds the watched ports' sockets a probe runs on; probed
	// counts the probes sent per guest MAC while it migrates here.
	probing map[*os.File]bool
	probed  map[string]int
	wg      sync.WaitGroup
}

func newAnnouncements(netns string, activate func(datapath.Port) error, kick func(), log logr.Logger) *announcements {
	return &announcements{netns: netns, activate: activate, kick: kick, log: log, watching: map[string]*os.File{}, announced: map[string]bool{},
		probing: map[*os.File]bool{}, probed: map[string]int{}, opened: func(datapath.Port, string, time.Time, time.Time) {}}
}

// probesSent returns how many standby probes went into the standby port
// of the guest with MAC mac while it migrates here.
func (w *announcements) probesSent(mac string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.probed[mac]
}

// Announced reports the MACs whose guests announced themselves on a
// Standby port of this node.
func (w *announcements) Announced() map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]bool, len(w.announced))
	for k, v := range w.announced {
		out[k] = v
	}
	return out
}

// sync watches exactly the plan's Standby ports, answers their ARP
// requests from neighbours (Plan.Neighbours) and forgets announcements of
// MACs that no longer migrate here.
func (w *announcements) sync(ports []datapath.Port, neighbours map[string]map[netip.Addr]net.HardwareAddr, probeFrom map[string]Gateway) {
	want := map[string]datapath.Port{}
	migrating := map[string]bool{}
	for _, p := range ports {
		if p.Standby {
			want[p.HostIfName] = p
		}
		if p.Migrating {
			migrating[p.MAC.String()] = true
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.neighbours, w.probeFrom = neighbours, probeFrom
	for mac := range w.announced {
		if !migrating[mac] {
			delete(w.announced, mac)
		}
	}
	for mac := range w.probed {
		if !migrating[mac] {
			delete(w.probed, mac)
		}
	}
	for name, f := range w.watching {
		if _, ok := want[name]; !ok {
			f.Close() // ends its reader
			delete(w.watching, name)
		}
	}
	for name, p := range want {
		f, ok := w.watching[name]
		if !ok {
			var err error
			if f, err = w.open(name); err != nil {
				w.log.Error(err, "watch a migration target port for the guest's announce; the switch-over waits for the API", "port", name)
				continue
			}
			w.watching[name] = f
			w.wg.Go(func() { w.read(f, p) })
		}
		// Probes start with the network's gateway, which a later plan
		// may bring.
		if w.probing[f] || w.announced[p.MAC.String()] {
			continue
		}
		if gw, ok := probeFrom[p.Network]; ok {
			if dst, ok := firstIPv4Prefix(p.IPs); ok {
				w.probing[f] = true
				w.wg.Go(func() { w.probe(f, p, gw, dst) })
			}
		}
	}
}

// probe sends the standby probe (probeFrame) from gw to dst into port
// p through its socket f every probeInterval, until the port's guest
// announced itself or the port is no longer watched.
func (w *announcements) probe(f *os.File, p datapath.Port, gw Gateway, dst netip.Addr) {
	t := time.NewTicker(probeInterval)
	defer t.Stop()
	defer func() {
		w.mu.Lock()
		delete(w.probing, f)
		w.mu.Unlock()
	}()
	for seq := uint16(1); ; seq++ {
		w.mu.Lock()
		done := w.announced[p.MAC.String()] || w.watching[p.HostIfName] != f
		w.mu.Unlock()
		if done {
			return
		}
		if _, err := f.Write(probeFrame(p.MAC, gw.MAC, gw.IP, dst, seq)); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			w.log.V(1).Info("standby probe not sent", "port", p.HostIfName, "error", err.Error())
		} else {
			w.mu.Lock()
			w.probed[p.MAC.String()]++
			w.mu.Unlock()
		}
		<-t.C
	}
}

func firstIPv4Prefix(ps []netip.Prefix) (netip.Addr, bool) {
	for _, p := range ps {
		if a := p.Addr().Unmap(); a.Is4() {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// open returns a packet socket receiving the frames on interface name, in
// the datapath's namespace; read picks the guest's RARP out of them.
func (w *announcements) open(name string) (*os.File, error) {
	return openPortSocket(w.netns, name)
}

// openPortSocket returns a packet socket receiving the frames that host
// interface name (in network namespace netns) receives from its pod, and
// sending frames into the pod through it.
func openPortSocket(netns, name string) (*os.File, error) {
	var f *os.File
	err := nl.Do(netns, func() error {
		ifc, err := net.InterfaceByName(name)
		if err != nil {
			return err
		}
		// ETH_P_ALL: a protocol-specific packet socket is not fed frames
		// that a bridge port's rx handler consumes; taps of all frames are.
		proto := int(htons(unix.ETH_P_ALL))
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return err
		}
		// Only what the pod sends: the bridge also floods the source
		// guest's broadcasts out of this port, with its MAC and address.
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1); err != nil {
			unix.Close(fd)
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: ifc.Index}); err != nil {
			unix.Close(fd)
			return err
		}
		f = os.NewFile(uintptr(fd), "rarp:"+name)
		return nil
	})
	return f, err
}

// read waits for the first frame on f that only p's guest can have sent
// (see guestFrame), opens p and records the announcement.
func (w *announcements) read(f *os.File, p datapath.Port) {
	name, mac := p.HostIfName, p.MAC
	buf := make([]byte, 256)
	for {
		n, err := f.Read(buf)
		if errors.Is(err, unix.ENETDOWN) {
			// The port went down (the socket reports it once) and may come
			// back up: the guest's first frame is still to be read.
			w.log.Info("a migration target port went down; still waiting for its guest's first frame", "port", name)
			continue
		}
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				w.log.Error(err, "read announces", "port", name)
			}
			return
		}
		if w.answerARP(f, buf[:n], p) {
			continue
		}
		what := guestFrame(buf[:n], p)
		if what == "" {
			continue
		}
		w.mu.Lock()
		first := !w.announced[mac.String()]
		w.announced[mac.String()] = true
		w.mu.Unlock()
		if first {
			start := time.Now()
			err := w.activate(p)
			if err != nil {
				// The next plan opens it.
				w.log.Error(err, "open a migration target port at its guest's first frame; the next plan does", "port", name)
			}
			open := time.Now()
			w.log.Info("migrated guest runs here; activated its port", "port", name, "mac", mac.String(), "frame", what,
				"activateMs", float64(open.Sub(start).Microseconds())/1000, "activated", err == nil)
			if err == nil {
				w.opened(p, what, start, open)
			}
			w.kick()
		}
	}
}

// guestFrame says what frame (received on a migration target's Standby
// port) shows that the port's guest runs there, "" if it does not: QEMU's
// announce (RARP from the guest's MAC), or an IPv4 or IPv6 packet from the
// guest's MAC and one of its addresses to a unicast address, which only
// the running guest sends (the launcher pod's own stack holds neither
// once plumbed). ARP and IPv6
// neighbour discovery do not count: before plumbing, the pod's own stack
// answers those for the guest's address with the guest's MAC. The first
// IP frame comes before QEMU's RARP when the guest resumes with frames
// queued, and QEMU's main loop is slow to announce.
func guestFrame(b []byte, p datapath.Port) string {
	if len(b) < 14 || !bytes.Equal(b[6:12], p.MAC) {
		return ""
	}
	if binary.BigEndian.Uint16(b[12:14]) == unix.ETH_P_IP && len(b) >= 34 && podsProbeReply(b) {
		return ""
	}
	return portFrame(b, p)
}

// portFrame says what frame b, sent by port p's pod, is if only a guest
// with p's MAC and addresses sends such frames ("" if not): its RARP, or
// an IPv4 or IPv6 packet from one of its addresses to a unicast one
// (guestFrame).
func portFrame(b []byte, p datapath.Port) string {
	if len(b) < 14 || !bytes.Equal(b[6:12], p.MAC) {
		return ""
	}
	switch binary.BigEndian.Uint16(b[12:14]) {
	case ethPRARP:
		return "RARP"
	case unix.ETH_P_IP:
		if len(b) < 34 || b[14]>>4 != 4 {
			return ""
		}
		src, dst := netip.AddrFrom4([4]byte(b[26:30])), netip.AddrFrom4([4]byte(b[30:34]))
		// Unicast only: the pod's own stack may report its multicast
		// groups (IGMP) from the guest's address before plumbing.
		if hasIP(p.IPs, src) && !dst.IsMulticast() && dst != netip.AddrFrom4([4]byte{255, 255, 255, 255}) && b[23] != 2 {
			return "IPv4 from " + src.String()
		}
	case unix.ETH_P_IPV6:
		if len(b) < 54 || b[14]>>4 != 6 {
			return ""
		}
		src, dst := netip.AddrFrom16([16]byte(b[22:38])), netip.AddrFrom16([16]byte(b[38:54]))
		if src.IsLinkLocalUnicast() || dst.IsMulticast() || !hasIP(p.IPs, src) {
			return ""
		}
		// Neighbour discovery right after the fixed header (the pod's
		// own stack answers solicitations for the guest's address).
		if b[20] == 58 && len(b) > 54 && b[54] >= 133 && b[54] <= 137 {
			return ""
		}
		return "IPv6 from " + src.String()
	}
	return ""
}

// answerARP answers, on the Standby port's socket f, an ARP request b
// that port p's pod sent from its own MAC and address for one of the
// network's neighbours, with the neighbour's MAC; it reports whether b
// was such a request. The request itself is dropped by the port's
// standby rules (it would teach the network the guest's new place before
// the guest runs there), yet a pod whose own stack sends the guest's
// traffic (KubeVirt's masquerade binding: the guest is behind NAT in the
// pod) must resolve its peer before the first packet that opens the
// port can leave: without an answer that packet never comes and the
// switch-over waits for the API. OVN-Kubernetes answers ARP for known
// addresses locally too.
func (w *announcements) answerARP(f *os.File, b []byte, p datapath.Port) bool {
	req, ok := parseARPRequest(b)
	if !ok || !bytes.Equal(req.senderMAC, p.MAC) || !hasIP(p.IPs, req.senderIP) {
		return false
	}
	w.mu.Lock()
	mac := w.neighbours[p.Network][req.targetIP]
	w.mu.Unlock()
	if mac == nil || bytes.Equal(mac, p.MAC) {
		return true
	}
	if _, err := f.Write(arpReply(req, mac)); err != nil {
		w.log.Error(err, "answer a migration target pod's ARP request", "port", p.HostIfName, "for", req.targetIP.String())
		return true
	}
	w.log.V(1).Info("answered a migration target pod's ARP request", "port", p.HostIfName, "for", req.targetIP.String(), "mac", mac.String())
	return true
}

// arpRequest is an Ethernet ARP request for an IPv4 address.
type arpRequest struct {
	senderMAC          net.HardwareAddr
	senderIP, targetIP netip.Addr
}

// parseARPRequest reads an Ethernet frame holding an ARP request
// (Ethernet, IPv4, opcode 1).
func parseARPRequest(b []byte) (arpRequest, bool) {
	if len(b) < 42 || binary.BigEndian.Uint16(b[12:14]) != unix.ETH_P_ARP {
		return arpRequest{}, false
	}
	a := b[14:]
	if binary.BigEndian.Uint16(a[0:2]) != 1 || binary.BigEndian.Uint16(a[2:4]) != unix.ETH_P_IP || a[4] != 6 || a[5] != 4 ||
		binary.BigEndian.Uint16(a[6:8]) != 1 {
		return arpRequest{}, false
	}
	return arpRequest{senderMAC: net.HardwareAddr(bytes.Clone(a[8:14])),
		senderIP: netip.AddrFrom4([4]byte(a[14:18])), targetIP: netip.AddrFrom4([4]byte(a[24:28]))}, true
}

// arpReply is the Ethernet frame answering req with mac (padded to the
// minimum frame size).
func arpReply(req arpRequest, mac net.HardwareAddr) []byte {
	b := make([]byte, 60)
	copy(b[0:6], req.senderMAC)
	copy(b[6:12], mac)
	binary.BigEndian.PutUint16(b[12:14], unix.ETH_P_ARP)
	a := b[14:]
	binary.BigEndian.PutUint16(a[0:2], 1)
	binary.BigEndian.PutUint16(a[2:4], unix.ETH_P_IP)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:8], 2)
	copy(a[8:14], mac)
	t := req.targetIP.As4()
	copy(a[14:18], t[:])
	copy(a[18:24], req.senderMAC)
	s := req.senderIP.As4()
	copy(a[24:28], s[:])
	return b
}

func hasIP(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Addr().Unmap() == a {
			return true
		}
	}
	return false
}

// close stops every watch and waits for the readers.
func (w *announcements) close() {
	w.mu.Lock()
	for name, f := range w.watching {
		f.Close()
		delete(w.watching, name)
	}
	w.mu.Unlock()
	w.wg.Wait()
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// The standby probe. A guest behind NAT in its launcher pod (KubeVirt's
// masquerade binding) sends nothing on its own when it resumes on the
// target unless it has something in flight: its RARP announce stays on
// the pod's internal bridge, and its peers' traffic still goes to the
// source. So kvnet-node sends, into each Standby port with an IPv4
// address, an ICMP echo request from the network's gateway every
// probeInterval (probeFrame): the pod forwards it to the guest (its
// masquerade rules forward everything), which answers as soon as it runs,
// and that answer, leaving through the pod, is its first frame there.
// Until the launcher's rules are in place the pod's own stack may answer
// the probe itself; its answer is told apart by its TTL: a reply the pod
// sends starts at Linux's 64, one it forwards from the guest arrives with
// one less (podsProbeReply). Those the standby rules drop too.
const (
	probeInterval = 100 * time.Millisecond
	// ProbeID is the ICMP identifier of kvnet-node's probes ("kv"); the
	// standby rules know it.
	ProbeID = datapath.StandbyProbeID
	// podTTL is the TTL the pod's own stack (Linux) sends with.
	podTTL = datapath.PodTTL
)

// probeFrame is the Ethernet frame of probe number seq into a standby
// port with MAC dstMAC and IPv4 address dst, from gateway gw (MAC
// gwMAC): an ICMP echo request with identifier ProbeID.
func probeFrame(dstMAC, gwMAC net.HardwareAddr, gw, dst netip.Addr, seq uint16) []byte {
	payload := []byte("kvnet standby probe")
	b := make([]byte, 14+20+8+len(payload))
	copy(b[0:6], dstMAC)
	copy(b[6:12], gwMAC)
	binary.BigEndian.PutUint16(b[12:14], unix.ETH_P_IP)
	ip := b[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], uint16(20+8+len(payload)))
	ip[8] = podTTL
	ip[9] = unix.IPPROTO_ICMP
	s, d := gw.As4(), dst.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	binary.BigEndian.PutUint16(ip[10:12], inetChecksum(ip))
	icmp := b[34:]
	icmp[0] = 8 // echo request
	binary.BigEndian.PutUint16(icmp[4:6], ProbeID)
	binary.BigEndian.PutUint16(icmp[6:8], seq)
	copy(icmp[8:], payload)
	binary.BigEndian.PutUint16(icmp[2:4], inetChecksum(icmp))
	return b
}

// podsProbeReply reports whether Ethernet frame b (IPv4) is an echo reply
// to a probe that the pod's own stack sent (TTL podTTL), not one it
// forwarded from the guest.
func podsProbeReply(b []byte) bool {
	ihl := int(b[14]&0x0f) * 4
	if ihl < 20 || len(b) < 14+ihl+8 || b[14+9] != unix.IPPROTO_ICMP {
		return false
	}
	icmp := b[14+ihl:]
	return icmp[0] == 0 && binary.BigEndian.Uint16(icmp[4:6]) == ProbeID && b[14+8] == podTTL
}

// inetChecksum is the Internet checksum of b (its checksum field zero).
func inetChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i : i+2]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
