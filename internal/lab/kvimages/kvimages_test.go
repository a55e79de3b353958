package kvimages

import (
	"archive/tar"
	"encoding/hex"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// binaries are the files hack/build-kubevirt.sh writes.
var binaries = []string{
	"virt-operator", "virt-api", "virt-controller", "virt-handler", "virt-chroot", "virt-launcher",
	"virt-launcher-monitor", "virt-freezer", "virt-probe", "virt-tail", "container-disk", "node-labeller.sh",
}

// fakeInputs are small stand-ins for the built inputs: each binary's
// content is its name, the root file system one file.
func fakeInputs(t *testing.T) Inputs {
	t.Helper()
	dir := t.TempDir()
	in := Inputs{Version: "v1.7.0", BinDir: filepath.Join(dir, "bin"), RootFS: filepath.Join(dir, "rootfs.tar"), Disk: filepath.Join(dir, "disk.img")}
	if err := os.Mkdir(in.BinDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, b := range binaries {
		if err := os.WriteFile(filepath.Join(in.BinDir, b), []byte(b), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Create(in.RootFS)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeTar(f, []entry{{path: "usr", dir: true, mode: 0o755}, {path: "usr/sbin", dir: true, mode: 0o755}, {path: "usr/sbin/libvirtd", content: []byte("libvirtd"), mode: 0o755}}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.WriteFile(in.Disk, []byte("bootable disk"), 0o644); err != nil {
		t.Fatal(err)
	}
	return in
}

// file is what a test reads back of one tar entry.
type file struct {
	hdr     *tar.Header
	content string
}

// files reads every layer of img, the later ones over the earlier.
func files(t *testing.T, img v1.Image) map[string]file {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]file{}
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
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			m[strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")] = file{hdr: h, content: string(b)}
		}
		rc.Close()
	}
	return m
}

func TestAssemble(t *testing.T) {
	in := fakeInputs(t)
	imgs, err := Assemble(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		image, user string
		entry       []string
		bins        []string
	}{
		{Operator, "1001", []string{"/usr/bin/virt-operator"}, []string{"virt-operator"}},
		{API, "1001", []string{"/usr/bin/virt-api"}, []string{"virt-api"}},
		{Controller, "1001", []string{"/usr/bin/virt-controller"}, []string{"virt-controller"}},
		{Handler, "", []string{"/usr/bin/virt-handler"}, []string{"virt-handler", "virt-chroot"}},
		{Launcher, "", []string{"/usr/bin/virt-launcher"}, []string{
			"virt-launcher", "virt-launcher-monitor", "virt-freezer", "virt-probe", "virt-tail", "container-disk", "node-labeller.sh"}},
	} {
		img := imgs[tc.image]
		if img == nil {
			t.Fatalf("no image %s", tc.image)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Config.User != tc.user || strings.Join(cf.Config.Entrypoint, " ") != strings.Join(tc.entry, " ") || cf.OS != "linux" {
			t.Errorf("%s: user %q entrypoint %q os %q, want user %q entrypoint %q on linux", tc.image, cf.Config.User, cf.Config.Entrypoint, cf.OS, tc.user, tc.entry)
		}
		fs := files(t, img)
		for _, b := range tc.bins {
			f, ok := fs["usr/bin/"+b]
			if !ok || f.content != b || f.hdr.Mode&0o111 == 0 {
				t.Errorf("%s: /usr/bin/%s = %+v (present %v), want the built file, executable", tc.image, b, f.hdr, ok)
			}
		}
		if v := fs[".version"].content; v != "v1.7.0\n" {
			t.Errorf("%s: /.version = %q", tc.image, v)
		}
	}
	if p := files(t, imgs[Operator])["etc/passwd"].content; !strings.Contains(p, "nonroot-user:x:1001:1001:") {
		t.Errorf("virt-operator: /etc/passwd has no user 1001:\n%s", p)
	}

	// The launcher: libvirt's files, the stand-in virtqemud, the
	// capability of virt-launcher-monitor, Debian's root underneath.
	fs := files(t, imgs[Launcher])
	for _, p := range []string{"etc/libvirt/qemu.conf", "etc/libvirt/virtqemud.conf", "etc/libvirt/hooks/qemu", "usr/sbin/virtqemud", "usr/sbin/libvirtd"} {
		if _, ok := fs[p]; !ok {
			t.Errorf("virt-launcher: no /%s", p)
		}
	}
	if c := fs["etc/libvirt/qemu.conf"].content; !strings.Contains(c, `user = "qemu"`) || fs["etc/libvirt/qemu.conf"].hdr.Mode&0o004 == 0 {
		t.Errorf("virt-launcher: qemu.conf not world-readable or without the qemu user: mode %o\n%s", fs["etc/libvirt/qemu.conf"].hdr.Mode, c)
	}
	if l := fs["usr/lib/kvnet-lab/virtqemud"].hdr; l == nil || l.Typeflag != tar.TypeSymlink || l.Linkname != "/usr/sbin/libvirtd" {
		t.Errorf("virt-launcher: /usr/lib/kvnet-lab/virtqemud = %+v, want a symlink to /usr/sbin/libvirtd", l)
	}
	if w := fs["usr/sbin/virtqemud"].content; !strings.Contains(w, "exec /usr/lib/kvnet-lab/virtqemud") || !strings.Contains(w, "virtqemud-sock") {
		t.Errorf("virt-launcher: /usr/sbin/virtqemud does not start libvirtd as virtqemud:\n%s", w)
	}
	capability := fs["usr/bin/virt-launcher-monitor"].hdr.PAXRecords["SCHILY.xattr.security.capability"]
	// What `setcap cap_net_bind_service+ep` writes (getfattr -e hex).
	if got, want := hex.EncodeToString([]byte(capability)), "0100000200040000000000000000000000000000"; got != want {
		t.Errorf("virt-launcher-monitor: security.capability %s, want %s", got, want)
	}

	// One root file system blob under both.
	hl, _ := imgs[Handler].Layers()
	ll, _ := imgs[Launcher].Layers()
	hd, _ := hl[0].Digest()
	ld, _ := ll[0].Digest()
	if hd != ld {
		t.Errorf("the root file system layers differ: handler %s, launcher %s", hd, ld)
	}

	// The containerDisk: the disk under /disk/, owned by 107.
	gf := files(t, imgs[Guest])
	d, ok := gf["disk/"+GuestDiskName]
	if !ok || d.content != "bootable disk" || d.hdr.Uid != QEMUUID || d.hdr.Gid != QEMUUID || d.hdr.Mode&0o440 != 0o440 {
		t.Errorf("guest: /disk/%s = %+v (present %v), want the disk owned by %d and readable by it", GuestDiskName, d.hdr, ok, QEMUUID)
	}
	if len(gf) != 2 {
		t.Errorf("guest: files %v, want /disk and its disk only", keys(gf))
	}
}

func keys(m map[string]file) []string {
	var k []string
	for p := range m {
		k = append(k, p)
	}
	return k
}

// TestRefsFitTheOperator checks the names against how virt-operator
// derives the other components' images from its own (KubeVirt's
// pkg/virt-operator/util/config.go: registry, prefix and tag from
// "^(.*)/(.*)virt-operator([@:].*)?$", then <registry>/<prefix><name>:<tag>).
func TestRefsFitTheOperator(t *testing.T) {
	refs := RefsFor("10.89.0.1:5000", "v1.7.0")
	m := regexp.MustCompile(`^(.*)/(.*)virt-operator([@:].*)?$`).FindStringSubmatch(refs[Operator])
	if m == nil {
		t.Fatalf("operator image %q does not parse as virt-operator parses its own", refs[Operator])
	}
	registry, prefix, tag := m[1], m[2], strings.TrimPrefix(m[3], ":")
	for _, c := range Components {
		if want := registry + "/" + prefix + c + ":" + tag; refs[c] != want {
			t.Errorf("%s: %q, but the operator would deploy %q", c, refs[c], want)
		}
	}
	if tag != "v1.7.0" {
		t.Errorf("tag %q, want the KubeVirt version (the operator's KUBEVIRT_VERSION)", tag)
	}
	if refs[Guest] != "10.89.0.1:5000/kvnet-lab/guest:lab" {
		t.Errorf("guest image %q", refs[Guest])
	}
}

func TestAssembleBadInputs(t *testing.T) {
	in := fakeInputs(t)
	bad := in
	bad.Version = "v1.7.0 bad"
	if _, err := Assemble(bad); err == nil || !strings.Contains(err.Error(), `Inputs.Version "v1.7.0 bad"`) {
		t.Errorf("bad version: %v", err)
	}
	if err := os.Remove(filepath.Join(in.BinDir, "virt-tail")); err != nil {
		t.Fatal(err)
	}
	if _, err := Assemble(in); err == nil || !strings.Contains(err.Error(), "usr/bin/virt-tail") {
		t.Errorf("missing virt-tail: %v, want an error naming it", err)
	}
}

// TestPush pushes to a registry started in the test and reads every image
// back by its reference.
func TestPush(t *testing.T) {
	in := fakeInputs(t)
	srv := httptest.NewServer(registry.New(registry.WithBlobHandler(registry.NewDiskBlobHandler(t.TempDir())),
		registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	refs, err := Push(t.Context(), host, in)
	if err != nil {
		t.Fatal(err)
	}
	imgs, err := Assemble(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range append(Components, Guest) {
		ref, err := name.ParseReference(refs[c], name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		got, err := remote.Image(ref, remote.WithContext(t.Context()))
		if err != nil {
			t.Fatalf("pull %s: %v", refs[c], err)
		}
		gd, _ := got.Digest()
		wd, _ := imgs[c].Digest()
		if gd != wd {
			t.Errorf("%s: the registry has %s, assembled %s", refs[c], gd, wd)
		}
	}
}
