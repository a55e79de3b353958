package guest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"kvnet.io/kvnet/internal/repo"
)

func TestCheckQEMUNamesThePackage(t *testing.T) {
	t.Setenv("PATH", "")
	err := CheckQEMU()
	if err == nil {
		t.Fatal("CheckQEMU with an empty PATH: no error")
	}
	const want = "qemu-system-x86_64 not found: install Debian package qemu-system-x86"
	if err.Error() != want {
		t.Fatalf("CheckQEMU = %q, want %q", err, want)
	}
	if _, err := Start(context.Background(), Config{Name: "x"}); !errors.Is(err, ErrQEMUNotFound) {
		t.Fatalf("Start without QEMU = %v, want ErrQEMUNotFound", err)
	}
}

func TestFindImage(t *testing.T) {
	dir := t.TempDir()
	_, err := FindImage(dir)
	if !errors.Is(err, ErrImageNotBuilt) || !strings.Contains(err.Error(), "guest image not built: run hack/guest/build.sh") {
		t.Fatalf("FindImage(empty dir) = %v", err)
	}
	for _, f := range []string{"vmlinuz", "initramfs.cpio.gz"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	img, err := FindImage(dir)
	if err != nil {
		t.Fatal(err)
	}
	if img.Kernel != filepath.Join(dir, "vmlinuz") || img.Initrd != filepath.Join(dir, "initramfs.cpio.gz") {
		t.Fatalf("FindImage = %+v", img)
	}
}

func TestParseLease(t *testing.T) {
	l, err := ParseLease("KVNET-LEASE iface=eth1 mac=52:54:00:77:00:10 ip=10.77.0.10/24 router=10.77.0.1 dns=10.77.0.1,10.77.0.2 mtu=1400\r\n")
	if err != nil {
		t.Fatal(err)
	}
	if l.Iface != "eth1" || l.MAC.String() != "52:54:00:77:00:10" || l.Addr != netip.MustParsePrefix("10.77.0.10/24") ||
		l.Router != netip.MustParseAddr("10.77.0.1") || l.MTU != 1400 || l.IP() != netip.MustParseAddr("10.77.0.10") ||
		!slices.Equal(l.DNS, []netip.Addr{netip.MustParseAddr("10.77.0.1"), netip.MustParseAddr("10.77.0.2")}) {
		t.Fatalf("ParseLease = %+v", l)
	}
	l, err = ParseLease("KVNET-LEASE iface=eth0 mac=52:54:00:00:00:01 ip=192.0.2.5/32 router= dns= mtu=1500 future=1")
	if err != nil {
		t.Fatal(err)
	}
	if l.Router.IsValid() || len(l.DNS) != 0 {
		t.Fatalf("empty router and dns: %+v", l)
	}
	for _, bad := range []string{
		"KVNET-READY name=x",
		"KVNET-LEASE iface=eth0 mac=52:54:00:00:00:01 ip=192.0.2.5 mtu=1500",
		"KVNET-LEASE iface=eth0 mac=zz ip=192.0.2.5/24 mtu=1500",
		"KVNET-LEASE iface=eth0 mac=52:54:00:00:00:01 ip=192.0.2.5/24",
		"KVNET-LEASE iface=eth0 mac=52:54:00:00:00:01 ip=192.0.2.5/24 mtu=x",
		"KVNET-LEASE eth0",
	} {
		if _, err := ParseLease(bad); err == nil {
			t.Errorf("ParseLease(%q): no error", bad)
		}
	}
}

func TestParseLease6(t *testing.T) {
	l, err := ParseLease6("KVNET-LEASE6 iface=eth0 mac=02:6b:36:a8:32:04 ip=fd10:0:2::2/128 router=fe80::ff:fe00:0 dns=fd00:96::a mtu=1400\r\n")
	if err != nil {
		t.Fatal(err)
	}
	if l.Iface != "eth0" || l.MAC.String() != "02:6b:36:a8:32:04" || l.Addr != netip.MustParsePrefix("fd10:0:2::2/128") ||
		l.Router != netip.MustParseAddr("fe80::ff:fe00:0") || l.MTU != 1400 ||
		!slices.Equal(l.DNS, []netip.Addr{netip.MustParseAddr("fd00:96::a")}) {
		t.Fatalf("ParseLease6 = %+v", l)
	}
	for _, bad := range []string{
		// An IPv4 lease line is not an IPv6 one, and the other way round.
		"KVNET-LEASE iface=eth0 mac=52:54:00:00:00:01 ip=fd10:0:2::2/128 router= dns= mtu=1500",
		"KVNET-LEASE6 iface=eth0 mac=52:54:00:00:00:01 ip=10.0.2.2/24 router= dns= mtu=1500",
		"KVNET-LEASE6 iface=eth0 mac=52:54:00:00:00:01 ip=::ffff:10.0.2.2/128 router= dns= mtu=1500",
		"KVNET-LEASE6 iface=eth0 mac=52:54:00:00:00:01 ip=fd10:0:2::2 mtu=1500",
		"KVNET-LEASE6 iface=eth0 mac=52:54:00:00:00:01 ip=fd10:0:2::2/128",
	} {
		if _, err := ParseLease6(bad); err == nil {
			t.Errorf("ParseLease6(%q): no error", bad)
		}
	}
	if _, err := ParseLease("KVNET-LEASE6 iface=eth0 mac=52:54:00:00:00:01 ip=fd10:0:2::2/128 router= dns= mtu=1500"); err == nil {
		t.Error("ParseLease took a KVNET-LEASE6 line")
	}
}

func TestConsoleFollowsTheLog(t *testing.T) {
	p := filepath.Join(t.TempDir(), "console.log")
	old := "KVNET-LEASE iface=eth0 mac=52:54:00:00:00:01 ip=10.0.0.9/24 router= dns= mtu=1500\r\nKVNET-READY name=old\r\n"
	if err := os.WriteFile(p, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	c := newConsole(p, int64(len(old)))
	appendLog := func(s string) {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(s)
		f.Close()
		if err := c.poll(); err != nil {
			t.Fatal(err)
		}
	}
	appendLog("")
	if c.ready || len(c.leases) != 0 {
		t.Fatalf("lines of an earlier run counted: ready=%v leases=%v", c.ready, c.leases)
	}
	appendLog("[    1.0] some kernel line\r\nKVNET-LEASE iface=eth0 mac=52:54:00:00:00:01 ip=10.0.0.5/24 rou")
	if len(c.leases) != 0 {
		t.Fatal("half a line parsed")
	}
	appendLog("ter=10.0.0.1 dns=10.0.0.1 mtu=1400\r\nKVNET-ERROR insmod virtio_net\r\n")
	if l, ok := c.leases["eth0"]; !ok || l.IP() != netip.MustParseAddr("10.0.0.5") {
		t.Fatalf("lease eth0 = %+v, %v", l, ok)
	}
	appendLog("KVNET-LEASE iface=eth0 mac=52:54:00:00:00:01 ip=10.0.0.6/24 router=10.0.0.1 dns=10.0.0.1 mtu=1400\r\nKVNET-READY name=vm\r\n")
	if l := c.leases["eth0"]; l.IP() != netip.MustParseAddr("10.0.0.6") {
		t.Fatalf("newest lease eth0 = %+v, want 10.0.0.6", l)
	}
	if !c.ready || len(c.errors) != 1 || c.errors[0] != "KVNET-ERROR insmod virtio_net" {
		t.Fatalf("ready=%v errors=%q", c.ready, c.errors)
	}
	if c.name != "vm" {
		t.Fatalf("ready name = %q, want vm (not the earlier run's)", c.name)
	}
	// A DHCPv6 lease is kept apart: the IPv4 one of the NIC stays.
	appendLog("KVNET-LEASE6 iface=eth0 mac=52:54:00:00:00:01 ip=fd10:0:2::2/128 router=fe80::1 dns= mtu=1400\r\n")
	if l := c.leases6["eth0"]; l.IP() != netip.MustParseAddr("fd10:0:2::2") {
		t.Fatalf("DHCPv6 lease eth0 = %+v, want fd10:0:2::2", l)
	}
	if l := c.leases["eth0"]; l.IP() != netip.MustParseAddr("10.0.0.6") {
		t.Fatalf("after a DHCPv6 lease, lease eth0 = %+v, want 10.0.0.6 still", l)
	}
	// The DHCPv6 address goes, then comes back.
	appendLog("KVNET-LEASE6-GONE iface=eth0 reason=RELEASE6\r\n")
	if l, ok := c.leases6["eth0"]; ok || !c.gone6["eth0"] {
		t.Fatalf("after KVNET-LEASE6-GONE: DHCPv6 lease eth0 = %+v, %v; gone %v", l, ok, c.gone6)
	}
	if l := c.leases["eth0"]; l.IP() != netip.MustParseAddr("10.0.0.6") {
		t.Fatalf("after the DHCPv6 address went, lease eth0 = %+v, want 10.0.0.6 still", l)
	}
	appendLog("KVNET-LEASE6 iface=eth0 mac=52:54:00:00:00:01 ip=fd10:0:2::2/128 router=fe80::1 dns= mtu=1400\r\n")
	if _, ok := c.leases6["eth0"]; !ok || c.gone6["eth0"] {
		t.Fatalf("after a new DHCPv6 lease: leases6 %v, gone %v", c.leases6, c.gone6)
	}
}

func TestConfigArgs(t *testing.T) {
	c := Config{
		Name:       "vm-a",
		Image:      Image{Kernel: "/k", Initrd: "/i"},
		NICs:       []NIC{{Tap: "tap0", MAC: "52:54:00:00:00:01"}, {Tap: "tap1", MAC: "52:54:00:00:00:02"}},
		MemoryMB:   96,
		ConsoleLog: "/tmp/c.log",
		QMPSocket:  "/tmp/q.sock",
		Incoming:   "tcp:0.0.0.0:4444",
	}
	got := strings.Join(c.args(), " ")
	for _, want := range []string{
		"-accel tcg", "-m 96", "-nodefaults", "-no-reboot", "-kernel /k", "-initrd /i",
		"-append console=ttyS0 quiet panic=-1 kvnet.name=vm-a",
		"-chardev file,id=console,path=/tmp/c.log,append=on -serial chardev:console",
		"-qmp unix:/tmp/q.sock,server=on,wait=off",
		"-netdev tap,id=n0,ifname=tap0,script=no,downscript=no -device virtio-net-pci,netdev=n0,mac=52:54:00:00:00:01,romfile=",
		"-netdev tap,id=n1,ifname=tap1,script=no,downscript=no -device virtio-net-pci,netdev=n1,mac=52:54:00:00:00:02,romfile=",
		"-incoming tcp:0.0.0.0:4444",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("args lack %q:\n%s", want, got)
		}
	}
}

func TestConfigArgsDisk(t *testing.T) {
	c := Config{Name: "vm-a", Disk: "/d.img", ConsoleLog: "/tmp/c.log", QMPSocket: "/tmp/q.sock", MemoryMB: 96}
	got := strings.Join(c.args(), " ")
	if want := "-drive file=/d.img,format=raw,if=virtio,snapshot=on"; !strings.Contains(got, want) {
		t.Errorf("args lack %q:\n%s", want, got)
	}
	for _, not := range []string{"-kernel", "-initrd", "-append"} {
		if strings.Contains(got, not) {
			t.Errorf("args boot from the disk but have %s:\n%s", not, got)
		}
	}
	if err := (Config{Name: "vm", Disk: "/dev/null"}).validate(); err != nil {
		t.Errorf("a disk without an image: %v", err)
	}
	for name, c := range map[string]Config{
		"missing disk":    {Name: "vm", Disk: "/nonexistent/disk.img"},
		"disk with comma": {Name: "vm", Disk: "/dev/null,x"},
	} {
		if err := c.validate(); err == nil || !strings.Contains(err.Error(), "Disk") {
			t.Errorf("%s: error %v, want one naming Disk", name, err)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	img := Image{Kernel: "/dev/null", Initrd: "/dev/null"}
	ok := Config{Name: "vm-a", Image: img, NICs: []NIC{{Tap: "tap0", MAC: "52:54:00:00:00:01"}}}
	if err := ok.validate(); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]Config{
		"name with space": {Name: "vm a", Image: img},
		"no image":        {Name: "vm"},
		"missing image":   {Name: "vm", Image: Image{Kernel: "/nonexistent/k", Initrd: "/nonexistent/i"}},
		"bad MAC":         {Name: "vm", Image: img, NICs: []NIC{{Tap: "tap0", MAC: "52:54"}}},
		"multicast MAC":   {Name: "vm", Image: img, NICs: []NIC{{Tap: "tap0", MAC: "01:00:5e:00:00:01"}}},
		"tap twice":       {Name: "vm", Image: img, NICs: []NIC{{Tap: "t", MAC: "52:54:00:00:00:01"}, {Tap: "t", MAC: "52:54:00:00:00:02"}}},
		"tap with comma":  {Name: "vm", Image: img, NICs: []NIC{{Tap: "t,x", MAC: "52:54:00:00:00:01"}}},
	} {
		if err := c.validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// fakeQEMU serves QMP on a unix socket: the greeting, then replies to each
// command, with events before and after some replies.
func fakeQEMU(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		w := json.NewEncoder(conn)
		w.Encode(map[string]any{"QMP": map[string]any{"version": map[string]any{"qemu": map[string]int{"major": 7, "minor": 2, "micro": 0}}, "capabilities": []string{"oob"}}})
		sc := bufio.NewScanner(conn)
		negotiated := false
		migrateQueries := 0
		for sc.Scan() {
			var req struct {
				Execute   string          `json:"execute"`
				Arguments json.RawMessage `json:"arguments"`
				ID        json.RawMessage `json:"id"`
			}
			if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
				w.Encode(map[string]any{"error": map[string]string{"class": "GenericError", "desc": "bad json"}})
				continue
			}
			reply := func(v any) { w.Encode(map[string]any{"return": v, "id": req.ID}) }
			event := func(name string) {
				w.Encode(map[string]any{"event": name, "data": map[string]string{"status": "x"}, "timestamp": map[string]int64{"seconds": 1700000000, "microseconds": 5}})
			}
			if !negotiated && req.Execute != "qmp_capabilities" {
				w.Encode(map[string]any{"error": map[string]string{"class": "CommandNotFound", "desc": "negotiate first"}, "id": req.ID})
				continue
			}
			switch req.Execute {
			case "qmp_capabilities":
				negotiated = true
				reply(map[string]any{})
			case "query-status":
				event("RESUME")
				reply(map[string]any{"running": true, "singlestep": false, "status": "running"})
			case "migrate":
				var a struct{ URI string }
				json.Unmarshal(req.Arguments, &a)
				if a.URI != "tcp:192.0.2.1:4444" {
					w.Encode(map[string]any{"error": map[string]string{"class": "GenericError", "desc": "bad uri " + a.URI}, "id": req.ID})
					continue
				}
				reply(map[string]any{})
				event("MIGRATION")
			case "query-migrate":
				migrateQueries++
				if migrateQueries < 3 {
					reply(map[string]any{"status": "active", "expected-downtime": 300, "total-time": 10})
				} else {
					event("STOP")
					reply(map[string]any{"status": "completed", "downtime": 42, "total-time": 321, "setup-time": 1, "ram": map[string]int64{"transferred": 1000, "total": 2000}})
				}
			default:
				w.Encode(map[string]any{"error": map[string]string{"class": "CommandNotFound", "desc": "The command " + req.Execute + " has not been found"}, "id": req.ID})
			}
		}
	}()
	return sock
}

func TestQMP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q, err := DialQMP(ctx, fakeQEMU(t))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if v := q.Greeting().QMP.Version.QEMU; v.Major != 7 || v.Minor != 2 {
		t.Errorf("greeting version = %+v", v)
	}
	st, err := q.QueryStatus()
	if err != nil || !st.Running || st.Status != "running" {
		t.Fatalf("QueryStatus = %+v, %v", st, err)
	}
	ev, err := q.WaitEvent(ctx, "RESUME")
	if err != nil || ev.Time.Unix() != 1700000000 || !strings.Contains(string(ev.Data), "status") {
		t.Fatalf("WaitEvent(RESUME) = %+v, %v", ev, err)
	}
	_, err = q.Execute("no-such-command", nil)
	var qe *QMPError
	if !errors.As(err, &qe) || qe.Class != "CommandNotFound" {
		t.Fatalf("unknown command: %v", err)
	}
	if err := q.Migrate("tcp:10.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "bad uri") {
		t.Fatalf("Migrate to a bad URI: %v", err)
	}
	if err := q.Migrate("tcp:192.0.2.1:4444"); err != nil {
		t.Fatal(err)
	}
	mi, err := q.WaitMigration(ctx)
	if err != nil || mi.Status != "completed" || mi.DowntimeMS != 42 || mi.TotalTimeMS != 321 || mi.RAM == nil || mi.RAM.Transferred != 1000 {
		t.Fatalf("WaitMigration = %+v, %v", mi, err)
	}
	if _, err := q.WaitEvent(ctx, "STOP"); err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, e := range q.Events() {
		names = append(names, e.Name)
	}
	if !slices.Equal(names, []string{"RESUME", "MIGRATION", "STOP"}) {
		t.Fatalf("Events = %v", names)
	}
	q.Close()
	if _, err := q.Execute("query-status", nil); !errors.Is(err, ErrQMPClosed) {
		t.Fatalf("Execute after Close = %v, want ErrQMPClosed", err)
	}
}

func TestExecRejectsMultiLine(t *testing.T) {
	if _, err := Exec(context.Background(), "", netip.MustParseAddr("127.0.0.1"), "a\nb"); err == nil {
		t.Fatal("no error")
	}
}

// TestNotInShippedBinaries: the package is lab-only; the binaries that run
// in a cluster must not link it.
func TestNotInShippedBinaries(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-buildvcs=false", "-deps", "./cmd/kvnet-controller", "./cmd/kvnet-node", "./cmd/kvnet-cni")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, out)
	}
	for dep := range strings.Lines(string(out)) {
		if strings.TrimSpace(dep) == "kvnet.io/kvnet/internal/lab/guest" {
			t.Fatal("kvnet.io/kvnet/internal/lab/guest is linked into kvnet-controller, kvnet-node or kvnet-cni")
		}
	}
}
