package images_test

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"kvnet.io/kvnet/internal/images"
)

func TestParsePlatforms(t *testing.T) {
	ps, err := images.ParsePlatforms("linux/amd64, linux/arm64")
	if err != nil || len(ps) != 2 || ps[1].Arch != "arm64" {
		t.Fatalf("ParsePlatforms = %v, %v", ps, err)
	}
	for _, bad := range []string{"", "amd64", "windows/amd64", "linux/", "linux/AMD64", "linux/amd64,"} {
		if _, err := images.ParsePlatforms(bad); err == nil {
			t.Errorf("ParsePlatforms(%q) = nil error", bad)
		}
	}
}

// TestBuild builds the images for the host's platform, as `make images`
// does, then reads them back from the OCI layout and from the tarball:
// each has the platform asked for, an entrypoint naming a binary the layer
// holds, and that binary is a static executable of the right command.
func TestBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries (a minute); not in -short")
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	host := images.Platform{OS: "linux", Arch: runtime.GOARCH}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	results, err := images.Build(ctx, images.Options{
		Repo: repo, Out: out, Registry: "registry.example/kvnet", Tag: "v9.9.9",
		Platforms: []images.Platform{host}, Go: goCommand(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != len(images.Images) {
		t.Fatalf("%d results, want %d", len(results), len(images.Images))
	}
	for _, res := range results {
		t.Run(res.Image.Name, func(t *testing.T) {
			if want := "registry.example/kvnet/" + res.Image.Name + ":v9.9.9"; res.Ref != want {
				t.Errorf("ref %q, want %q", res.Ref, want)
			}
			p, err := layout.FromPath(res.Layout)
			if err != nil {
				t.Fatal(err)
			}
			top, err := p.ImageIndex()
			if err != nil {
				t.Fatal(err)
			}
			topManifest, err := top.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			if len(topManifest.Manifests) != 1 || topManifest.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "v9.9.9" {
				t.Fatalf("index.json = %+v, want one index named v9.9.9", topManifest.Manifests)
			}
			idx, err := top.ImageIndex(topManifest.Manifests[0].Digest)
			if err != nil {
				t.Fatal(err)
			}
			im, err := idx.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			if len(im.Manifests) != 1 || im.Manifests[0].Platform == nil || im.Manifests[0].Platform.Architecture != runtime.GOARCH {
				t.Fatalf("index manifests = %+v, want one for linux/%s", im.Manifests, runtime.GOARCH)
			}
			img, err := idx.Image(im.Manifests[0].Digest)
			if err != nil {
				t.Fatal(err)
			}
			files := checkImage(t, res.Image, img)

			// The tarball holds the same image under its reference.
			fromTar, err := tarball.ImageFromPath(res.Tarballs[host], nil)
			if err != nil {
				t.Fatal(err)
			}
			// The `docker save` format rewrites the manifest (Docker media
			// types), so compare what it cannot change: the config.
			d1, _ := img.ConfigName()
			d2, err := fromTar.ConfigName()
			if err != nil || d1 != d2 {
				t.Errorf("tarball image config %v (%v), layout's %v", d2, err, d1)
			}
			manifest := readTarManifest(t, res.Tarballs[host])
			if len(manifest) != 1 || len(manifest[0].RepoTags) != 1 || manifest[0].RepoTags[0] != res.Ref {
				t.Errorf("tarball manifest.json = %+v, want RepoTags [%s]", manifest, res.Ref)
			}

			// The entrypoint is the right program: run it.
			dir := t.TempDir()
			for name, data := range files {
				if err := os.WriteFile(filepath.Join(dir, name), data, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			checkRuns(t, dir, res.Image.Binaries)
			checkSkopeo(t, res, host)
		})
	}
}

// checkImage checks the config and returns the binaries in BinDir.
func checkImage(t *testing.T, want images.Image, img v1.Image) map[string][]byte {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("config platform %s/%s", cf.OS, cf.Architecture)
	}
	entry := images.BinDir + "/" + want.Binaries[0]
	if len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != entry {
		t.Errorf("entrypoint %q, want [%s]", cf.Config.Entrypoint, entry)
	}
	if cf.Config.User != want.User {
		t.Errorf("user %q, want %q", cf.Config.User, want.User)
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	files := map[string][]byte{}
	tmp := false
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "tmp/" || h.Name == "tmp" {
			tmp = h.Mode&0o1777 == 0o1777
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		dir, base := filepath.Split("/" + h.Name)
		if filepath.Clean(dir) != images.BinDir {
			t.Errorf("unexpected file %s", h.Name)
			continue
		}
		if h.Mode&0o111 == 0 {
			t.Errorf("%s is not executable (mode %o)", h.Name, h.Mode)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[base] = data
	}
	if !tmp {
		t.Error("no world-writable /tmp in the image")
	}
	for _, b := range want.Binaries {
		data, ok := files[b]
		if !ok {
			t.Errorf("%s/%s missing from the image (has %d files)", images.BinDir, b, len(files))
			continue
		}
		f, err := elf.NewFile(bytes.NewReader(data))
		if err != nil {
			t.Errorf("%s: not an ELF executable: %v", b, err)
			continue
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s is dynamically linked: the image has no libc", b)
			}
		}
	}
	if len(files) != len(want.Binaries) {
		t.Errorf("image holds %d files, want %d", len(files), len(want.Binaries))
	}
	return files
}

// checkRuns runs each binary in a way that identifies it.
func checkRuns(t *testing.T, dir string, binaries []string) {
	t.Helper()
	for _, b := range binaries {
		var cmd *exec.Cmd
		var want string
		switch b {
		case "kvnet-cni":
			cmd = exec.Command(filepath.Join(dir, b))
			cmd.Env = []string{"CNI_COMMAND=VERSION"}
			cmd.Stdin = strings.NewReader(`{"cniVersion":"1.0.0"}`)
			want = `"supportedVersions"`
		case "kvnet-controller":
			cmd = exec.Command(filepath.Join(dir, b), "--help")
			want = "-leader-elect"
		case "kvnet-node":
			cmd = exec.Command(filepath.Join(dir, b), "--help")
			want = "-cni-bin-dir"
		default:
			t.Fatalf("no check for binary %s", b)
		}
		outb, _ := cmd.CombinedOutput()
		if !strings.Contains(string(outb), want) {
			t.Errorf("%s: output does not contain %q:\n%s", b, want, outb)
		}
	}
}

type tarManifest []struct{ RepoTags []string }

func readTarManifest(t *testing.T, path string) tarManifest {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("manifest.json not found in %s: %v", path, err)
		}
		if h.Name == "manifest.json" {
			var m tarManifest
			if err := json.NewDecoder(tr).Decode(&m); err != nil {
				t.Fatal(err)
			}
			return m
		}
	}
}

func goCommand() string {
	if g := os.Getenv("GO"); g != "" {
		return g
	}
	return "go"
}

// checkSkopeo has skopeo, an OCI implementation that shares no code with
// the builder, read the layout (by its tag) and the tarball: both must be
// the platform built, with the entrypoint asked for.
func checkSkopeo(t *testing.T, res images.Result, p images.Platform) {
	t.Helper()
	if _, err := exec.LookPath("skopeo"); err != nil {
		// Fail, not skip: a missing tool must not pass as green.
		t.Fatalf("skopeo not in PATH (hack/install-deps.sh installs it): %v", err)
	}
	for _, ref := range []string{"oci:" + res.Layout + ":v9.9.9", "docker-archive:" + res.Tarballs[p]} {
		out, err := exec.Command("skopeo", "inspect", "--config", ref).Output()
		if err != nil {
			t.Errorf("skopeo inspect --config %s: %v", ref, err)
			continue
		}
		var cf struct {
			Architecture, OS string
			Config           struct{ Entrypoint []string }
		}
		if err := json.Unmarshal(out, &cf); err != nil {
			t.Errorf("skopeo inspect %s: %v\n%s", ref, err, out)
			continue
		}
		if cf.Architecture != p.Arch || cf.OS != p.OS || len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != images.BinDir+"/"+res.Image.Binaries[0] {
			t.Errorf("skopeo reads %s as %s/%s entrypoint %v", ref, cf.OS, cf.Architecture, cf.Config.Entrypoint)
		}
	}
}
