//go:build kubevirt

package kvimages

import (
	"archive/tar"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"kvnet.io/kvnet/internal/repo"
	"kvnet.io/kvnet/internal/testenv"
)

// TestRealImages builds the real inputs (KubeVirt v1.8.4 from its module,
// the Debian root file system, the guest disk; cached after the first
// run, which takes long), pushes every image to a registry started in the
// test, pulls virt-launcher and virt-handler back, unpacks them and runs
// their programs in a chroot: the cgo binaries built against bookworm's
// libvirt must run on the image's libraries, and the stand-in virtqemud
// must be libvirtd. Build tag kubevirt: go test -tags kubevirt.
func TestRealImages(t *testing.T) {
	testenv.NeedsRoot(t)
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	in, err := Build(t.Context(), root, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("inputs: %+v", in)
	srv := httptest.NewServer(registry.New(registry.WithBlobHandler(registry.NewDiskBlobHandler(t.TempDir())),
		registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	refs, err := Push(t.Context(), strings.TrimPrefix(srv.URL, "http://"), in)
	if err != nil {
		t.Fatal(err)
	}
	pull := func(c string) v1.Image {
		t.Helper()
		ref, err := name.ParseReference(refs[c], name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		img, err := remote.Image(ref, remote.WithContext(t.Context()))
		if err != nil {
			t.Fatalf("pull %s: %v", refs[c], err)
		}
		return img
	}
	for _, c := range []string{Operator, API, Controller, Guest} {
		pull(c)
	}

	run := func(dir string, argv ...string) string {
		t.Helper()
		out, err := exec.Command("chroot", append([]string{dir}, argv...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("chroot %s %s: %v\n%s", filepath.Base(dir), strings.Join(argv, " "), err, out)
		}
		return string(out)
	}
	// help runs a program with --help, which exits 0 or 2 (pflag): what
	// counts is that it ran, loaded by the image's libraries, and printed
	// its usage.
	help := func(dir, bin string) {
		t.Helper()
		out, err := exec.Command("chroot", dir, bin, "--help").CombinedOutput()
		if !strings.Contains(strings.ToLower(string(out)), "usage") {
			t.Errorf("chroot %s %s --help: %v, no usage:\n%s", filepath.Base(dir), bin, err, out)
		}
	}
	launcher := unpack(t, pull(Launcher))
	for _, b := range []string{"virt-launcher", "virt-launcher-monitor", "virt-freezer", "virt-probe", "virt-tail"} {
		help(launcher, "/usr/bin/"+b)
	}
	// The cgo binary finds every library it links (ldd says "not found"
	// for one it does not).
	if out := run(launcher, "ldd", "/usr/bin/virt-launcher"); !strings.Contains(out, "libvirt.so.0") || strings.Contains(out, "not found") {
		t.Errorf("virt-launcher's libraries in its image:\n%s", out)
	}
	// virtqemud is libvirtd under that name: it answers libvirt's version.
	if out := run(launcher, "readlink", "-f", "/usr/lib/kvnet-lab/virtqemud"); strings.TrimSpace(out) != "/usr/sbin/libvirtd" {
		t.Errorf("/usr/lib/kvnet-lab/virtqemud resolves to %q, want /usr/sbin/libvirtd", out)
	}
	if out := run(launcher, "/usr/sbin/virtqemud", "--version"); !strings.Contains(out, "virtqemud (libvirt) ") {
		t.Errorf("virtqemud --version = %q, want libvirt's daemon", out)
	}
	// The stand-in virtqemud serves libvirt's QEMU driver as KubeVirt uses
	// it. As root, started as node-labeller.sh starts it, it answers
	// domcapabilities for q35 under emulation on qemu:///system and runs
	// under the name virtqemud; as the qemu user with KubeVirt's
	// XDG_RUNTIME_DIR (a non-root virt-launcher), it answers on the
	// virtqemud-sock session URI. Each runs in a mount and PID namespace
	// of its own, rooted at the unpacked launcher image, with a fresh /run.
	inNS := func(inner string) string {
		t.Helper()
		outer := `mount -t sysfs sys "$1/sys" && mount --rbind /dev "$1/dev" && mount -t tmpfs tmpfs "$1/run" && chroot "$1" sh -c "$2"`
		out, err := exec.Command("unshare", "--mount", "--fork", "--pid", "--mount-proc="+filepath.Join(launcher, "proc"),
			"sh", "-c", outer, "sh", launcher, inner).CombinedOutput()
		if err != nil {
			t.Errorf("in the launcher image: %v\n%s", err, out)
		}
		return string(out)
	}
	const waitSock = `for i in $(seq 100); do [ -S /var/run/libvirt/libvirt-sock ] && break; sleep 0.1; done; `
	const session = `qemu+unix:///session?socket=/var/run/libvirt/virtqemud-sock`
	out := inNS(`virtqemud -d -f /etc/libvirt/virtqemud.conf; ` + waitSock +
		`virsh -c qemu:///system domcapabilities --machine q35 --arch x86_64 --virttype qemu | grep "<machine>"; ps -eo comm | grep -x virtqemud`)
	for _, want := range []string{"<machine>pc-q35-", "virtqemud"} {
		if !strings.Contains(out, want) {
			t.Errorf("virtqemud as root: want %q in:\n%s", want, out)
		}
	}
	out = inNS(`mkdir -p /var/run/libvirt /var/run/kubevirt-private && chown 107:107 /var/run/libvirt /var/run/kubevirt-private &&
cp /etc/libvirt/virtqemud.conf /var/run/libvirt/ &&
setpriv --reuid 107 --regid 107 --clear-groups env XDG_RUNTIME_DIR=/var/run XDG_CONFIG_HOME=/var/run/kubevirt-private XDG_CACHE_HOME=/var/run/kubevirt-private HOME=/home/qemu sh -c '
virtqemud -d -f /var/run/libvirt/virtqemud.conf; ` + waitSock + `virsh -c "` + session + `" version'`)
	if !strings.Contains(out, "Running hypervisor: QEMU ") {
		t.Errorf("virtqemud as the qemu user, on %s: want QEMU's version in:\n%s", session, out)
	}
	if out := run(launcher, "qemu-system-x86_64", "--version"); !strings.Contains(out, "QEMU emulator version") {
		t.Errorf("qemu-system-x86_64 --version = %q", out)
	}
	if out := run(launcher, "id", "qemu"); !strings.HasPrefix(out, "uid=107(qemu) gid=107(qemu)") {
		t.Errorf("id qemu = %q, want uid and gid 107", out)
	}
	handler := unpack(t, pull(Handler))
	help(handler, "/usr/bin/virt-handler")
	help(handler, "/usr/bin/virt-chroot")
	if out := run(handler, "ldd", "/usr/bin/virt-handler"); strings.Contains(out, "not found") {
		t.Errorf("virt-handler's libraries in its image:\n%s", out)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// unpack writes img's layers into a new directory, the later over the
// earlier (no whiteouts: these images have none).
func unpack(t *testing.T, img v1.Image) string {
	t.Helper()
	dir := t.TempDir()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, filepath.Clean("/"+h.Name))
			switch h.Typeflag {
			case tar.TypeDir:
				err = os.MkdirAll(p, os.FileMode(h.Mode)&os.ModePerm)
			case tar.TypeSymlink:
				os.Remove(p)
				err = os.Symlink(h.Linkname, p)
			case tar.TypeLink:
				os.Remove(p)
				err = os.Link(filepath.Join(dir, filepath.Clean("/"+h.Linkname)), p)
			case tar.TypeReg:
				os.Remove(p)
				var f *os.File
				if f, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&os.ModePerm); err == nil {
					_, err = io.Copy(f, tr)
					f.Close()
				}
			}
			if err != nil {
				t.Fatalf("unpack %s: %v", h.Name, err)
			}
		}
		rc.Close()
	}
	return dir
}
