// Package images builds kvnet's container images from the repository alone:
// no container daemon, no base image to pull. The binaries are static Go
// programs (CGO_ENABLED=0), so an image is one layer holding them on an
// empty root file system, with an OCI config whose entrypoint runs the
// right binary.
//
// [Build] writes, per image, an OCI image layout (a multi-platform index,
// readable by `skopeo copy oci:<dir>:<tag>`, `crane push --index`,
// `oras`) and, per platform, a tarball in the `docker save` format
// (`ctr images import`, `docker load`, `crane push <tar>`, `kind load
// image-archive`).
package images

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"kvnet.io/kvnet/internal/repo"
)

// BinDir is where the binaries live inside every image.
const BinDir = "/usr/local/bin"

// Image describes one of kvnet's images.
type Image struct {
	// Name is the image's repository name under the registry, and the name
	// config/ uses for it ("kvnet-controller").
	Name string
	// Binaries are the commands (under cmd/) the image holds in BinDir;
	// the first is the entrypoint.
	Binaries []string
	// User the entrypoint runs as ("" = root).
	User string
}

// Images are kvnet's images. kvnet-node installs kvnet-cni, which sits
// next to it, into the node's CNI directory at start.
var Images = []Image{
	{Name: "kvnet-controller", Binaries: []string{"kvnet-controller"}, User: "65532:65532"},
	{Name: "kvnet-node", Binaries: []string{"kvnet-node", "kvnet-cni"}},
}

// Platform is a GOOS/GOARCH pair.
type Platform struct{ OS, Arch string }

func (p Platform) String() string { return p.OS + "/" + p.Arch }

// ParsePlatforms parses "linux/amd64,linux/arm64".
func ParsePlatforms(s string) ([]Platform, error) {
	var out []Platform
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		os, arch, ok := strings.Cut(item, "/")
		if !ok || os != "linux" || !validArch.MatchString(arch) {
			return nil, fmt.Errorf("platform %q: want linux/<goarch>, e.g. linux/amd64", item)
		}
		out = append(out, Platform{OS: os, Arch: arch})
	}
	if len(out) == 0 {
		return nil, errors.New("no platform given")
	}
	return out, nil
}

var validArch = regexp.MustCompile(`^[a-z0-9]+$`)

// Options configure Build.
type Options struct {
	// Repo is the module's root directory (where go.mod is).
	Repo string
	// Out is the directory the images are written to.
	Out string
	// Registry prefixes the images' names in the tarballs
	// ("ghcr.io/kvnet" → ghcr.io/kvnet/kvnet-node:<Tag>).
	Registry string
	// Tag of the images, also the version label.
	Tag string
	// Platforms to build; default the build host's linux/GOARCH.
	Platforms []Platform
	// Created is the images' creation time; zero means the Unix epoch, so
	// that the same sources give the same digests.
	Created time.Time
	// Go is the go command (default "go").
	Go string
	// Log receives progress lines (nil: none).
	Log io.Writer
}

// Result is what Build wrote for one image.
type Result struct {
	Image Image
	// Ref is the full reference, e.g. ghcr.io/kvnet/kvnet-node:v0.1.0.
	Ref string
	// Layout is the OCI image layout directory; its index.json names the
	// multi-platform index with org.opencontainers.image.ref.name = Tag.
	Layout string
	// Index is the digest of the multi-platform index.
	Index v1.Hash
	// Tarballs maps each platform to its `docker save`-format tarball.
	Tarballs map[Platform]string
}

// Build compiles the binaries for every platform and writes the images.
func Build(ctx context.Context, o Options) ([]Result, error) {
	if o.Go == "" {
		o.Go = "go"
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if len(o.Platforms) == 0 {
		return nil, errors.New("images: no platform given")
	}
	if o.Tag == "" {
		return nil, errors.New("images: empty tag")
	}
	refs := map[string]name.Tag{}
	for _, im := range Images {
		ref, err := name.NewTag(strings.TrimSuffix(o.Registry, "/") + "/" + im.Name + ":" + o.Tag)
		if err != nil {
			return nil, fmt.Errorf("images: registry %q, tag %q: %w", o.Registry, o.Tag, err)
		}
		refs[im.Name] = ref
	}
	binDirs := map[Platform]string{}
	for _, p := range o.Platforms {
		dir := filepath.Join(o.Out, "bin", p.OS+"_"+p.Arch)
		if err := compile(ctx, o, p, dir); err != nil {
			return nil, err
		}
		binDirs[p] = dir
	}
	var results []Result
	for _, im := range Images {
		ref := refs[im.Name]
		res := Result{Image: im, Ref: ref.String(), Layout: filepath.Join(o.Out, im.Name), Tarballs: map[Platform]string{}}
		idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
		for _, p := range o.Platforms {
			img, err := image(im, p, binDirs[p], o)
			if err != nil {
				return nil, fmt.Errorf("image %s (%s): %w", im.Name, p, err)
			}
			idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
				Add:        img,
				Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: p.OS, Architecture: p.Arch}},
			})
			tb := filepath.Join(o.Out, fmt.Sprintf("%s_%s_%s.tar", im.Name, p.OS, p.Arch))
			if err := tarball.WriteToFile(tb, ref, img); err != nil {
				return nil, fmt.Errorf("image %s (%s): write %s: %w", im.Name, p, tb, err)
			}
			res.Tarballs[p] = tb
		}
		if err := os.RemoveAll(res.Layout); err != nil {
			return nil, err
		}
		lp, err := layout.Write(res.Layout, empty.Index)
		if err != nil {
			return nil, fmt.Errorf("image %s: layout %s: %w", im.Name, res.Layout, err)
		}
		if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
			"org.opencontainers.image.ref.name": o.Tag,
		})); err != nil {
			return nil, fmt.Errorf("image %s: layout %s: %w", im.Name, res.Layout, err)
		}
		if res.Index, err = idx.Digest(); err != nil {
			return nil, err
		}
		fmt.Fprintf(o.Log, "%s  %s  (%s)\n", res.Ref, res.Index, res.Layout)
		results = append(results, res)
	}
	return results, nil
}

// compile builds every image's binaries for p into dir: static, trimmed.
func compile(ctx context.Context, o Options, p Platform, dir string) error {
	var pkgs []string
	for _, im := range Images {
		for _, b := range im.Binaries {
			pkgs = append(pkgs, "./cmd/"+b)
		}
	}
	cmd := repo.GoBuild(ctx, o.Go, o.Repo, append([]string{"-ldflags=-s -w", "-o", dir + "/"}, pkgs...)...)
	cmd.Env = append(cmd.Env, "GOOS="+p.OS, "GOARCH="+p.Arch)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	fmt.Fprintf(o.Log, "building %s for %s\n", strings.Join(pkgs, " "), p)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build for %s: %w\n%s", p, err, stderr.String())
	}
	return nil
}

// image assembles one platform's image: one layer with the binaries and a
// world-writable /tmp, and a config naming the entrypoint.
func image(im Image, p Platform, binDir string, o Options) (v1.Image, error) {
	layerTar, err := rootfs(im, binDir, o.Created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{CreatedBy: "kvnet images: " + strings.Join(im.Binaries, ", "), Created: v1.Time{Time: o.Created}},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = p.OS, p.Arch
	cf.Created = v1.Time{Time: o.Created}
	cf.Config.Entrypoint = []string{BinDir + "/" + im.Binaries[0]}
	cf.Config.Env = []string{"PATH=" + BinDir + ":/usr/bin:/bin"}
	cf.Config.User = im.User
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":   im.Name,
		"org.opencontainers.image.version": o.Tag,
		"org.opencontainers.image.source":  "kvnet.io/kvnet",
	}
	return mutate.ConfigFile(img, cf)
}

// rootfs returns the uncompressed layer: /tmp, BinDir and the binaries,
// owned by root, with fixed times so that digests are reproducible.
func rootfs(im Image, binDir string, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := []struct {
		name string
		mode int64
	}{{"tmp/", 0o1777}, {"usr/", 0o755}, {"usr/local/", 0o755}, {"usr/local/bin/", 0o755}}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d.name, Mode: d.mode, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	for _, b := range im.Binaries {
		data, err := os.ReadFile(filepath.Join(binDir, b))
		if err != nil {
			return nil, fmt.Errorf("binary %s: %w", b, err)
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(BinDir, "/") + "/" + b, Mode: 0o755, Size: int64(len(data)), ModTime: mtime, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
