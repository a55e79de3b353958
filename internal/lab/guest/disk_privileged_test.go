package guest

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kvnet.io/kvnet/internal/repo"
)

// TestDiskBootsNamedByDHCP boots the guest's containerDisk disk
// (hack/guest/build-disk.sh) as KubeVirt would, from the firmware with the
// disk on virtio-blk and no kernel command line of ours: the guest must
// boot, take its lease, take its name from the lease's hostname (as
// KubeVirt's DHCP sends the VMI's name) and answer it over HTTP.
func TestDiskBootsNamedByDHCP(t *testing.T) {
	requirePrivileged(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	disk, err := EnsureDisk(ctx, root, "")
	if err != nil {
		t.Fatal(err)
	}
	const mac, vmi = "52:54:00:77:00:20", "vmi-from-dhcp"
	ip := netip.MustParseAddr("10.77.0.20")
	l := newLab(t)
	l.addTap(t, "tap0", "br0")
	l.serveDHCPHostname(t, "br0", labGateway, labMTU, mac, ip, vmi)

	// Name is QEMU's only: the disk boots without kvnet.name=.
	vm := l.start(t, ctx, Config{Name: "disk-vm", Disk: disk, NICs: []NIC{{Tap: "tap0", MAC: mac}}})
	lease, err := vm.WaitLease(ctx, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	if lease.Addr != netip.PrefixFrom(ip, 24) || lease.MAC.String() != mac {
		t.Fatalf("lease = %+v, want %s/24 for %s", lease, ip, mac)
	}
	if err := vm.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if errs := vm.ConsoleErrors(); len(errs) > 0 {
		t.Errorf("guest errors: %q", errs)
	}
	if ready := vm.ReadyName(); ready != vmi {
		t.Errorf("KVNET-READY name=%q, want the DHCP hostname %q", ready, vmi)
	}
	page, err := l.httpGet(ctx, ip)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(page) != vmi {
		t.Errorf("GET / = %q, want %q", page, vmi)
	}
	if err := l.echoOnce(ctx, ip, "hello disk\n"); err != nil {
		t.Fatal(err)
	}
}

// TestCmdlineNameWinsOverDHCP boots the disk's kernel and initramfs the
// lab's way (kvnet.name= on the command line) with a DHCP server that
// sends a hostname: the command line's name must stay. It uses the
// disk's copy of the image, so the shared .cache/guest is not rebuilt.
func TestCmdlineNameWinsOverDHCP(t *testing.T) {
	requirePrivileged(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureDisk(ctx, root, ""); err != nil {
		t.Fatal(err)
	}
	img, err := FindImage(filepath.Join(DefaultDiskDir(), "image"))
	if err != nil {
		t.Fatal(err)
	}
	const mac = "52:54:00:77:00:21"
	ip := netip.MustParseAddr("10.77.0.21")
	l := newLab(t)
	l.addTap(t, "tap0", "br0")
	l.serveDHCPHostname(t, "br0", labGateway, labMTU, mac, ip, "not-the-name")
	vm := l.start(t, ctx, Config{Name: "vm-cmdline", Image: img, NICs: []NIC{{Tap: "tap0", MAC: mac}}})
	if _, err := vm.WaitLease(ctx, "eth0"); err != nil {
		t.Fatal(err)
	}
	if err := vm.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if got := vm.ReadyName(); got != "vm-cmdline" {
		t.Errorf("KVNET-READY name=%q, want the command line's vm-cmdline", got)
	}
	page, err := l.httpGet(ctx, ip)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(page) != "vm-cmdline" {
		t.Errorf("GET / = %q, want vm-cmdline", page)
	}
}
