package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// The Flannel images, named as upstream's kube-flannel.yml names its two:
//
//   - kvnet-lab/flannel: flanneld at /opt/bin/flanneld (hack/tools/cluster),
//     busybox's cp and sh, and Debian's iptables (nf_tables variant) with
//     the libraries and extensions it loads, copied from the host's
//     package: flanneld runs iptables even when it only cleans up.
//   - kvnet-lab/flannel-cni-plugin: the flannel CNI plugin at /flannel
//     (hack/tools/flannel-cni) and busybox's cp, which the DaemonSet's
//     init container runs to install it on the node.
//
// The reference plugins flannel delegates to (bridge, host-local, and
// portmap in its conflist) are the node's, in /opt/cni/bin, as a kubeadm
// node has them from its CNI package.

// iptablesBinary is the Debian iptables binary every iptables name links
// to (xtables-nft-multi: the nf_tables backend).
const iptablesBinary = "/usr/sbin/xtables-nft-multi"

// xtablesDir holds iptables' extensions (match and target modules).
const xtablesDir = "/usr/lib/x86_64-linux-gnu/xtables"

// iptablesNames are the names flanneld (go-iptables) runs.
var iptablesNames = []string{
	"iptables", "iptables-save", "iptables-restore",
	"ip6tables", "ip6tables-save", "ip6tables-restore",
}

// flannelImages assembles the two Flannel images from binDir (flanneld,
// flannel, busybox) and the host's iptables package.
func flannelImages(binDir string) ([]labImage, error) {
	read := func(name string) ([]byte, error) {
		b, err := os.ReadFile(filepath.Join(binDir, name))
		if err != nil {
			return nil, fmt.Errorf("flannel image: %w (run hack/build-cluster-tools.sh)", err)
		}
		return b, nil
	}
	flanneld, err := read("flanneld")
	if err != nil {
		return nil, err
	}
	plugin, err := read("flannel")
	if err != nil {
		return nil, err
	}
	bb, err := read("busybox")
	if err != nil {
		return nil, err
	}
	ipt, err := hostProgramFiles(iptablesBinary, xtablesDir)
	if err != nil {
		return nil, err
	}
	base := func() []file {
		return []file{
			{path: "bin", dir: true, mode: 0o755},
			{path: "tmp", dir: true, mode: 0o1777},
			{path: "run", dir: true, mode: 0o755},
			{path: "etc", dir: true, mode: 0o755},
			{path: "bin/busybox", content: bb, mode: 0o755},
			{path: "bin/cp", link: "busybox"},
			{path: "bin/sh", link: "busybox"},
		}
	}
	fl := append(base(), file{path: "opt/bin/flanneld", content: flanneld, mode: 0o755})
	fl = append(fl, ipt...)
	for _, n := range iptablesNames {
		fl = append(fl, file{path: "usr/sbin/" + n, link: path.Base(iptablesBinary)})
	}
	cni := append(base(), file{path: "flannel", content: plugin, mode: 0o755})
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin:/opt/bin"}
	return []labImage{
		{name: "flannel", files: withParents(fl), entry: []string{"/opt/bin/flanneld"}, env: env},
		{name: "flannel-cni-plugin", files: withParents(cni), env: env},
	}, nil
}

// hostProgramFiles returns a host program, every file in extDir (its
// loadable extensions) and the shared libraries and dynamic loader they
// need (as ldd lists them), at their host paths.
func hostProgramFiles(program, extDir string) ([]file, error) {
	paths := []string{program}
	exts, err := filepath.Glob(filepath.Join(extDir, "*.so"))
	if err != nil {
		return nil, err
	}
	paths = append(paths, exts...)
	var libs []string
	for _, p := range paths {
		out, err := exec.Command("ldd", p).Output()
		if err != nil {
			return nil, fmt.Errorf("flannel image: ldd %s: %w (install Debian packages iptables and libc-bin)", p, err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
				libs = append(libs, f[2])
			case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
				libs = append(libs, f[0]) // the dynamic loader
			}
		}
	}
	slices.Sort(libs)
	libs = slices.Compact(libs)
	var files []file
	for _, p := range append(paths, libs...) {
		b, err := os.ReadFile(p) // a symlink's target's content
		if err != nil {
			return nil, fmt.Errorf("flannel image: %w", err)
		}
		files = append(files, file{path: strings.TrimPrefix(p, "/"), content: b, mode: 0o755})
	}
	return files, nil
}

// withParents adds a directory entry for every parent of a file that has
// none, so that the layer's tree is complete.
func withParents(files []file) []file {
	have := map[string]bool{}
	for _, f := range files {
		if f.dir {
			have[f.path] = true
		}
	}
	var dirs []file
	for _, f := range files {
		for d := path.Dir(f.path); d != "." && !have[d]; d = path.Dir(d) {
			have[d] = true
			dirs = append(dirs, file{path: d, dir: true, mode: 0o755})
		}
	}
	slices.SortFunc(dirs, func(a, b file) int { return strings.Compare(a.path, b.path) })
	return append(dirs, files...)
}
