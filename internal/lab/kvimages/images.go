package kvimages

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"kvnet.io/kvnet/internal/lab/guest"
	"kvnet.io/kvnet/internal/lab/ociimage"
)

// The components, by image name.
const (
	Operator   = "virt-operator"
	API        = "virt-api"
	Controller = "virt-controller"
	Handler    = "virt-handler"
	Launcher   = "virt-launcher"
	// Guest is the lab guest's containerDisk.
	Guest = "guest"
)

// Components are KubeVirt's images, in push order.
var Components = []string{Operator, API, Controller, Handler, Launcher}

// Repository is where KubeVirt's images go under the registry; the guest
// goes to GuestRepository with tag GuestTag, beside the lab's own images.
const (
	Repository      = "kubevirt"
	GuestRepository = "kvnet-lab/guest"
	GuestTag        = "lab"
)

// QEMUUID is the user and group KubeVirt runs QEMU (and a non-root
// virt-launcher) as, and the owner a containerDisk's disk must have.
const QEMUUID = 107

// nonrootUID is the user of virt-operator, virt-api and virt-controller,
// as in KubeVirt's own images.
const nonrootUID = 1001

// Refs are the images' references in one registry.
type Refs map[string]string

// RefsFor gives every image's reference under registry (host:port) for
// KubeVirt version: <registry>/kubevirt/<component>:<version> and
// <registry>/kvnet-lab/guest:lab.
func RefsFor(registry, version string) Refs {
	r := Refs{Guest: registry + "/" + GuestRepository + ":" + GuestTag}
	for _, c := range Components {
		r[c] = registry + "/" + Repository + "/" + c + ":" + version
	}
	return r
}

// Inputs are the built files the images are assembled from.
type Inputs struct {
	// Version is KubeVirt's version (e.g. v1.7.0), the tag of its images.
	Version string
	// BinDir holds hack/build-kubevirt.sh's binaries.
	BinDir string
	// RootFS is hack/build-kubevirt-rootfs.sh's tar of the Debian root
	// file system under virt-launcher and virt-handler.
	RootFS string
	// Disk is the guest's bootable disk (hack/guest/build-disk.sh).
	Disk string
}

// Build runs the build scripts of the repository at repoRoot (each a no-op
// when its output is cached, see the package doc) and returns their
// outputs. The first run takes long: KubeVirt's build alone is many
// minutes on 2 cores, the root file system downloads Debian packages. It
// needs root (debootstrap) and hack/install-deps.sh --kubevirt's packages.
func Build(ctx context.Context, repoRoot string, log io.Writer) (Inputs, error) {
	if log == nil {
		log = io.Discard
	}
	script := func(rel string) (string, error) {
		var stdout bytes.Buffer
		cmd := exec.CommandContext(ctx, "bash", filepath.Join(repoRoot, rel))
		cmd.Dir = repoRoot
		cmd.Stdout, cmd.Stderr = &stdout, log
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("%s: %w", rel, err)
		}
		return strings.TrimSpace(stdout.String()), nil
	}
	var in Inputs
	var err error
	if in.BinDir, err = script("hack/build-kubevirt.sh"); err != nil {
		return Inputs{}, err
	}
	v, err := os.ReadFile(filepath.Join(in.BinDir, ".version"))
	if err != nil {
		return Inputs{}, fmt.Errorf("hack/build-kubevirt.sh output: %w", err)
	}
	in.Version = strings.TrimSpace(string(v))
	if in.RootFS, err = script("hack/build-kubevirt-rootfs.sh"); err != nil {
		return Inputs{}, err
	}
	if in.Disk, err = guest.EnsureDisk(ctx, repoRoot, ""); err != nil {
		return Inputs{}, err
	}
	return in, nil
}

var validVersion = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// Assemble builds every image (Components and Guest) from in, for the
// host's architecture. Layers are read from the input files when pushed;
// the root file system's tar is compressed once into RootFS+".gz".
func Assemble(in Inputs) (map[string]v1.Image, error) {
	if !validVersion.MatchString(in.Version) {
		return nil, fmt.Errorf("kubevirt images: Inputs.Version %q is not a valid image tag", in.Version)
	}
	bin := func(n string) string { return filepath.Join(in.BinDir, n) }
	usrBin := func(n string, mode int64) entry {
		return entry{path: "usr/bin/" + n, src: bin(n), mode: mode}
	}
	version := entry{path: ".version", content: []byte(in.Version + "\n"), mode: 0o644}
	imgs := map[string]v1.Image{}

	// virt-operator, virt-api, virt-controller: static binaries on an
	// otherwise empty root, running as nonroot-user (1001).
	for _, c := range []string{Operator, API, Controller} {
		layer, err := filesLayer([]entry{
			{path: "etc", dir: true, mode: 0o755},
			{path: "etc/passwd", mode: 0o644, content: []byte(fmt.Sprintf(
				"root:x:0:0:root:/root:/sbin/nologin\nnonroot-user:x:%d:%d::/home/nonroot-user:/sbin/nologin\n", nonrootUID, nonrootUID))},
			{path: "etc/group", mode: 0o644, content: []byte(fmt.Sprintf("root:x:0:\nnonroot-user:x:%d:\n", nonrootUID))},
			{path: "home", dir: true, mode: 0o755},
			{path: "home/nonroot-user", dir: true, mode: 0o755, uid: nonrootUID, gid: nonrootUID},
			{path: "tmp", dir: true, mode: 0o1777},
			{path: "usr", dir: true, mode: 0o755},
			{path: "usr/bin", dir: true, mode: 0o755},
			version,
			usrBin(c, 0o755),
		})
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", c, err)
		}
		img, err := image(c, in.Version, []v1.Layer{layer}, fmt.Sprint(nonrootUID), []string{"/usr/bin/" + c})
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", c, err)
		}
		imgs[c] = img
	}

	// virt-handler and virt-launcher: the Debian root file system (one
	// layer, the same blob in both) and KubeVirt's files on it.
	rootfs, err := gzipLayer(in.RootFS)
	if err != nil {
		return nil, err
	}
	handler, err := filesLayer([]entry{
		version,
		usrBin("virt-handler", 0o755),
		usrBin("virt-chroot", 0o755),
	})
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", Handler, err)
	}
	if imgs[Handler], err = image(Handler, in.Version, []v1.Layer{rootfs, handler}, "", []string{"/usr/bin/virt-handler"}); err != nil {
		return nil, fmt.Errorf("image %s: %w", Handler, err)
	}
	launcherFiles := []entry{
		version,
		usrBin("virt-launcher", 0o755),
		// virt-launcher-monitor starts virt-launcher, which starts
		// virtqemud with CAP_NET_BIND_SERVICE as an ambient capability
		// when it runs as non-root: the file capability makes that
		// possible (KubeVirt's image sets it too).
		{path: "usr/bin/virt-launcher-monitor", src: bin("virt-launcher-monitor"), mode: 0o755,
			xattrs: map[string]string{"security.capability": fileCapability(capNetBindService)}},
		usrBin("virt-freezer", 0o755),
		usrBin("virt-probe", 0o755),
		usrBin("virt-tail", 0o755),
		usrBin("container-disk", 0o755),
		usrBin("node-labeller.sh", 0o755),
	}
	launcherFiles = append(launcherFiles, libvirtFiles()...)
	launcher, err := filesLayer(launcherFiles)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", Launcher, err)
	}
	if imgs[Launcher], err = image(Launcher, in.Version, []v1.Layer{rootfs, launcher}, "", []string{"/usr/bin/virt-launcher"}); err != nil {
		return nil, fmt.Errorf("image %s: %w", Launcher, err)
	}

	// The guest's containerDisk: the disk under /disk/, owned by QEMU's
	// user, on an empty root. KubeVirt runs the container with a binary
	// of its own, so the image needs nothing else.
	disk, err := filesLayer([]entry{
		{path: "disk", dir: true, mode: 0o755, uid: QEMUUID, gid: QEMUUID},
		{path: "disk/" + GuestDiskName, src: in.Disk, mode: 0o440, uid: QEMUUID, gid: QEMUUID},
	})
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", Guest, err)
	}
	if imgs[Guest], err = image(Guest, GuestTag, []v1.Layer{disk}, "", nil); err != nil {
		return nil, fmt.Errorf("image %s: %w", Guest, err)
	}
	return imgs, nil
}

// GuestDiskName is the disk's file name under /disk/ in the guest image.
const GuestDiskName = "kvnet-guest.img"

// capNetBindService is CAP_NET_BIND_SERVICE's number.
const capNetBindService = 10

// image is an OCI image of layers with the given user and entrypoint.
func image(title, version string, layers []v1.Layer, user string, entrypoint []string) (v1.Image, error) {
	return ociimage.New(layers, func(cf *v1.ConfigFile) {
		cf.Created = v1.Time{Time: epoch}
		cf.Config.Entrypoint = entrypoint
		cf.Config.User = user
		cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
		cf.Config.Labels = map[string]string{
			"org.opencontainers.image.title":   title,
			"org.opencontainers.image.version": version,
			"org.opencontainers.image.source":  "kvnet.io/kvnet (lab: internal/lab/kvimages)",
		}
	})
}

// Push assembles the images of in and pushes them to registry (host:port,
// plain HTTP as the lab's registry speaks); it returns their references.
// The root file system's layer is uploaded once: the second image finds
// the blob there.
func Push(ctx context.Context, registry string, in Inputs) (Refs, error) {
	imgs, err := Assemble(in)
	if err != nil {
		return nil, err
	}
	refs := RefsFor(registry, in.Version)
	for _, c := range append(append([]string(nil), Components...), Guest) {
		tag, err := name.NewTag(refs[c], name.Insecure)
		if err != nil {
			return nil, fmt.Errorf("image %s: reference %q: %w", c, refs[c], err)
		}
		if err := remote.Write(tag, imgs[c], remote.WithContext(ctx)); err != nil {
			return nil, fmt.Errorf("push %s: %w", refs[c], err)
		}
	}
	return refs, nil
}
