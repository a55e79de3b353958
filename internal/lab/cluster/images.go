package cluster

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"kvnet.io/kvnet/internal/images"
	"kvnet.io/kvnet/internal/lab/ociimage"
	"kvnet.io/kvnet/internal/repo"
)

// LabTag tags the lab's own images (pause, busybox) in the registry.
const LabTag = "lab"

// KvnetTag tags kvnet's images (make images) in the registry.
const KvnetTag = "dev"

// labImage is one of the lab's own images: files on an empty root.
type labImage struct {
	name  string
	files []file
	entry []string // entrypoint
	cmd   []string
	env   []string // nil: PATH=/bin
}

type file struct {
	path    string // inside the image
	content []byte
	mode    int64
	link    string // a symlink to this target when set
	dir     bool
}

// busyboxApplets are linked in the workload image: what workloads and
// tests run (wget is left out: Debian's busybox wget crashes on the lab
// host's kernel; httpget stands in for it).
var busyboxApplets = []string{
	"sh", "ash", "nc", "httpd", "ping", "nslookup", "ip", "ifconfig", "route", "hostname",
	"cat", "echo", "ls", "mkdir", "rm", "sleep", "env", "ps", "kill", "grep", "sed", "awk",
	"head", "tail", "wc", "true", "false", "test", "[", "date", "id", "uname", "netstat", "arp", "timeout",
}

// buildLabImages compiles pause and httpget and assembles the pause,
// busybox and coredns images (CoreDNS from hack/build-cluster-tools.sh).
func buildLabImages(ctx context.Context, repoRoot, binDir, work string) ([]labImage, error) {
	out := filepath.Join(work, "bin")
	cmd := repo.GoBuild(ctx, "go", repoRoot, "-ldflags=-s -w", "-o", out+"/",
		"./internal/lab/cluster/pause", "./internal/lab/cluster/httpget")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go build pause, httpget: %w\n%s", err, stderr.String())
	}
	read := func(p string) ([]byte, error) {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("image file: %w", err)
		}
		return b, nil
	}
	pause, err := read(filepath.Join(out, "pause"))
	if err != nil {
		return nil, err
	}
	httpget, err := read(filepath.Join(out, "httpget"))
	if err != nil {
		return nil, err
	}
	bb, err := read(filepath.Join(binDir, "busybox"))
	if err != nil {
		return nil, fmt.Errorf("%w (run hack/build-cluster-tools.sh: it unpacks Debian's busybox-static)", err)
	}
	bbFiles := []file{
		{path: "bin", dir: true, mode: 0o755},
		{path: "tmp", dir: true, mode: 0o1777},
		{path: "www", dir: true, mode: 0o755},
		{path: "etc", dir: true, mode: 0o755},
		{path: "etc/passwd", content: []byte("root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"), mode: 0o644},
		{path: "etc/group", content: []byte("root:x:0:\nnogroup:x:65534:\n"), mode: 0o644},
		{path: "www/index.html", content: []byte("kvnet-lab busybox\n"), mode: 0o644},
		{path: "bin/busybox", content: bb, mode: 0o755},
		{path: "bin/httpget", content: httpget, mode: 0o755},
	}
	for _, a := range busyboxApplets {
		bbFiles = append(bbFiles, file{path: "bin/" + a, link: "busybox"})
	}
	coredns, err := read(filepath.Join(binDir, "coredns"))
	if err != nil {
		return nil, fmt.Errorf("%w (run hack/build-cluster-tools.sh)", err)
	}
	return []labImage{
		{name: "pause", files: []file{{path: "pause", content: pause, mode: 0o755}}, entry: []string{"/pause"}},
		{name: "busybox", files: bbFiles, cmd: []string{"sh"}},
		{name: "coredns", files: []file{{path: "coredns", content: coredns, mode: 0o755}}, entry: []string{"/coredns"}},
	}, nil
}

// image assembles a labImage for the host's architecture.
func (li labImage) image() (v1.Image, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for _, f := range li.files {
		h := &tar.Header{Name: f.path, Mode: f.mode, ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case f.dir:
			h.Typeflag, h.Name = tar.TypeDir, f.path+"/"
		case f.link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, f.link, 0o777
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.content))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.content); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	return ociimage.New([]v1.Layer{layer}, func(cf *v1.ConfigFile) {
		cf.Config.Entrypoint, cf.Config.Cmd = li.entry, li.cmd
		cf.Config.Env = []string{"PATH=/bin"}
		if li.env != nil {
			cf.Config.Env = li.env
		}
		cf.Config.Labels = map[string]string{"org.opencontainers.image.title": li.name, "org.opencontainers.image.source": "kvnet.io/kvnet"}
	})
}

// ref is the image's name in the registry.
func labRef(registry, image string) string { return registry + "/kvnet-lab/" + image + ":" + LabTag }

// pushLabImages pushes the lab's images; it returns name → reference.
func pushLabImages(ctx context.Context, registry string, imgs []labImage) (map[string]string, error) {
	refs := map[string]string{}
	for _, li := range imgs {
		img, err := li.image()
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", li.name, err)
		}
		ref := labRef(registry, li.name)
		tag, err := name.NewTag(ref, name.Insecure)
		if err != nil {
			return nil, err
		}
		if err := remote.Write(tag, img, remote.WithContext(ctx)); err != nil {
			return nil, fmt.Errorf("push %s: %w", ref, err)
		}
		refs[li.name] = ref
	}
	return refs, nil
}

// pushKvnetImages builds kvnet's images the way `make images` does
// (internal/images, for the host's platform) and pushes each image's
// index to <registry>/kvnet/<name>:KvnetTag, as a user pushes to their own
// registry. It returns name → reference.
func pushKvnetImages(ctx context.Context, repoRoot, registry, work string, log io.Writer) (map[string]string, error) {
	prefix := registry + "/kvnet"
	results, err := images.Build(ctx, images.Options{
		Repo: repoRoot, Out: filepath.Join(work, "kvnet-images"), Registry: prefix, Tag: KvnetTag,
		Platforms: []images.Platform{{OS: "linux", Arch: runtime.GOARCH}}, Created: time.Unix(0, 0).UTC(), Log: log,
	})
	if err != nil {
		return nil, err
	}
	refs := map[string]string{}
	for _, r := range results {
		if err := pushLayoutIndex(ctx, r.Layout, r.Index, r.Ref); err != nil {
			return nil, fmt.Errorf("image %s: %w", r.Image.Name, err)
		}
		refs[r.Image.Name] = r.Ref
	}
	return refs, nil
}

// pushLayoutIndex pushes the image index with digest index from the OCI
// image layout dir to ref.
func pushLayoutIndex(ctx context.Context, dir string, index v1.Hash, ref string) error {
	lp, err := layout.FromPath(dir)
	if err != nil {
		return err
	}
	top, err := lp.ImageIndex()
	if err != nil {
		return err
	}
	idx, err := top.ImageIndex(index)
	if err != nil {
		return fmt.Errorf("index %s in %s: %w", index, dir, err)
	}
	tag, err := name.NewTag(ref, name.Insecure)
	if err != nil {
		return err
	}
	if err := remote.WriteIndex(tag, idx, remote.WithContext(ctx)); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	return nil
}

// PushLayouts pushes every image `make images` (hack/images) wrote to
// out, one OCI image layout per image whose index.json names its
// multi-platform index by tag, to <registry>/<image>:tag, and returns
// image → reference. It pushes the images of another checkout of the
// repository (an earlier release) as they were built there.
func PushLayouts(ctx context.Context, out, registry, tag string) (map[string]string, error) {
	entries, err := os.ReadDir(out)
	if err != nil {
		return nil, err
	}
	refs := map[string]string{}
	for _, e := range entries {
		dir := filepath.Join(out, e.Name())
		if !e.IsDir() {
			continue
		}
		lp, err := layout.FromPath(dir)
		if err != nil {
			continue // not a layout (the binaries' directory)
		}
		ii, err := lp.ImageIndex()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", dir, err)
		}
		top, err := ii.IndexManifest()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", dir, err)
		}
		found := false
		for _, m := range top.Manifests {
			if m.Annotations["org.opencontainers.image.ref.name"] != tag {
				continue
			}
			ref := registry + "/" + e.Name() + ":" + tag
			if err := pushLayoutIndex(ctx, dir, m.Digest, ref); err != nil {
				return nil, err
			}
			refs[e.Name()] = ref
			found = true
		}
		if !found {
			return nil, fmt.Errorf("%s: no index tagged %q", dir, tag)
		}
	}
	if len(refs) == 0 {
		return nil, fmt.Errorf("no image layouts in %s", out)
	}
	return refs, nil
}
