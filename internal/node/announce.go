package node

import (
	"errors"
	"net"
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
// node for the guest's announce. On the first one it opens the port at
// once (activate: the port's own rules, nothing else) and remembers the
// MAC, so that the next plan also has the port off Standby, without
// waiting for the API to say the migration completed.
type announcements struct {
	netns    string // the datapath's network namespace ("" is ours)
	activate func(datapath.Port) error
	kick     func()
	log      logr.Logger

	mu        sync.Mutex
	watching  map[string]*os.File // standby host interface -> packet socket
	announced map[string]bool     // MAC -> its guest announced itself here
	wg        sync.WaitGroup
}

func newAnnouncements(netns string, activate func(datapath.Port) error, kick func(), log logr.Logger) *announcements {
	return &announcements{netns: netns, activate: activate, kick: kick, log: log, watching: map[string]*os.File{}, announced: map[string]bool{}}
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

// sync watches exactly the plan's Standby ports and forgets announcements
// of MACs that no longer migrate here.
func (w *announcements) sync(ports []datapath.Port) {
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
	for mac := range w.announced {
		if !migrating[mac] {
			delete(w.announced, mac)
		}
	}
	for name, f := range w.watching {
		if _, ok := want[name]; !ok {
			f.Close() // ends its reader
			delete(w.watching, name)
		}
	}
	for name, p := range want {
		if _, ok := w.watching[name]; ok {
			continue
		}
		f, err := w.open(name)
		if err != nil {
			w.log.Error(err, "watch a migration target port for the guest's announce; the switch-over waits for the API", "port", name)
			continue
		}
		w.watching[name] = f
		w.wg.Go(func() { w.read(f, p) })
	}
}

// open returns a packet socket receiving the frames on interface name, in
// the datapath's namespace; read picks the guest's RARP out of them.
func (w *announcements) open(name string) (*os.File, error) {
	var f *os.File
	err := nl.Do(w.netns, func() error {
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
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: ifc.Index}); err != nil {
			unix.Close(fd)
			return err
		}
		f = os.NewFile(uintptr(fd), "rarp:"+name)
		return nil
	})
	return f, err
}

// read waits for a RARP frame from p's MAC on f, opens p and records the
// announcement.
func (w *announcements) read(f *os.File, p datapath.Port) {
	name, mac := p.HostIfName, p.MAC
	buf := make([]byte, 256)
	for {
		n, err := f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				w.log.Error(err, "read announces", "port", name)
			}
			return
		}
		if n >= 14 && buf[12] == ethPRARP>>8 && buf[13] == ethPRARP&0xff && net.HardwareAddr(buf[6:12]).String() == mac.String() {
			w.mu.Lock()
			first := !w.announced[mac.String()]
			w.announced[mac.String()] = true
			w.mu.Unlock()
			if first {
				start := time.Now()
				err := w.activate(p)
				if err != nil {
					// The next plan opens it.
					w.log.Error(err, "open a migration target port at its guest's announce; the next plan does", "port", name)
				}
				w.log.Info("migrated guest announced itself; activated its port", "port", name, "mac", mac.String(),
					"activateMs", float64(time.Since(start).Microseconds())/1000, "activated", err == nil)
				w.kick()
			}
		}
	}
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
