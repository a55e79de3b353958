package cni

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"kvnet.io/kvnet/internal/podnetworks"
)

func noEnv(string) string { return "" }

// TestHostFileFind: kvnet-cni finds kvnet-node's files on the host, or,
// inside thick Multus's daemon container, under /host; the host's copy
// wins; with neither, the error names both paths.
func TestHostFileFind(t *testing.T) {
	for _, f := range []hostFile{kubeconfigFile, statusFile} {
		std, thick := f.standard, filepath.Join("/host", f.standard)
		for _, tt := range []struct {
			name    string
			present []string
			want    string // "" : an error
		}{
			{"only the host path", []string{std}, std},
			{"only under /host (thick Multus)", []string{thick}, thick},
			{"both: the host path wins", []string{std, thick}, std},
			{"neither", nil, ""},
		} {
			t.Run(f.what+"/"+tt.name, func(t *testing.T) {
				root := t.TempDir()
				for _, p := range tt.present {
					write(t, filepath.Join(root, p), "{}")
				}
				got, err := f.find(root, "", noEnv)
				if tt.want != "" {
					if want := filepath.Join(root, tt.want); err != nil || got != want {
						t.Fatalf("find = %q, %v; want %q", got, err, want)
					}
					return
				}
				if err == nil {
					t.Fatalf("find = %q with neither file present", got)
				}
				for _, p := range []string{std, thick} {
					if !strings.Contains(err.Error(), filepath.Join(root, p)) {
						t.Errorf("error %q does not name %s", err, filepath.Join(root, p))
					}
				}
				if !strings.Contains(err.Error(), f.what) || !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("error %q: want it to say what it looked for and to wrap fs.ErrNotExist", err)
				}
			})
		}
	}
}

// TestHostFileCandidates: the NAD's option, else the environment, is
// used as given (no /host fallback); else the host path, then /host's.
func TestHostFileCandidates(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == statusFile.env {
				return v
			}
			return ""
		}
	}
	for _, tt := range []struct {
		name, option, env string
		want              []string
	}{
		{"default", "", "", []string{"/run/kvnet/cni-status.json", "/host/run/kvnet/cni-status.json"}},
		{"environment", "", "/tmp/env.json", []string{"/tmp/env.json"}},
		{"option over environment", "/tmp/opt.json", "/tmp/env.json", []string{"/tmp/opt.json"}},
	} {
		got := statusFile.candidates(tt.option, env(tt.env))
		if strings.Join(got, ",") != strings.Join(tt.want, ",") {
			t.Errorf("%s: candidates %q, want %q", tt.name, got, tt.want)
		}
	}
	if got := kubeconfigFile.candidates("", noEnv); len(got) != 2 || got[0] != DefaultKubeconfig || got[1] != "/host"+DefaultKubeconfig {
		t.Errorf("kubeconfig candidates %q", got)
	}
	// An explicit path that does not exist is an error naming it alone.
	root := t.TempDir()
	write(t, filepath.Join(root, "/host", DefaultStatusFile), "{}")
	if _, err := statusFile.find(root, "/tmp/missing.json", noEnv); err == nil ||
		!strings.Contains(err.Error(), "/tmp/missing.json") || strings.Contains(err.Error(), "/host") {
		t.Errorf("explicit missing path: %v", err)
	}
}

type staticSource podnetworks.Networks

func (s staticSource) PodNetworks(context.Context, string, string) (podnetworks.Networks, error) {
	return podnetworks.Networks(s), nil
}

// TestVerbsLookUnderHost: the verbs use the lookup. With neither the host's
// files nor /host's, STATUS answers code 50 and the allocation lookup
// fails, each naming both paths it tried; with kvnet-node's files only
// under /host (thick Multus's daemon container), STATUS reads the status
// file there and the lookup uses the kubeconfig there.
func TestVerbsLookUnderHost(t *testing.T) {
	root := t.TempDir()
	old := hostRoot
	hostRoot = root
	t.Cleanup(func() { hostRoot = old })
	t.Setenv(statusFile.env, "")
	t.Setenv(kubeconfigFile.env, "")
	args := &skel.CmdArgs{ContainerID: "c", IfName: "net1", Args: "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p",
		StdinData: []byte(`{"cniVersion":"1.1.0","type":"kvnet-cni","name":"ns_a","netAttachDefName":"ns/a","topology":"layer2","role":"secondary","subnets":"10.0.0.0/24","annotationTimeout":"1s"}`)}
	var used string
	p := &Plugin{NewSource: func(path string) (PodSource, error) {
		used = path
		return staticSource{"ns/a": {Network: "ns_a", IPAddresses: []string{"10.0.0.5/24"}}}, nil
	}}
	r, err := parse(args.StdinData)
	if err != nil {
		t.Fatal(err)
	}
	namesBoth := func(verb string, err error, f hostFile) *types.Error {
		t.Helper()
		var e *types.Error
		if !errors.As(err, &e) {
			t.Fatalf("%s without %s: %v, want a CNI error", verb, f.what, err)
		}
		for _, path := range []string{f.standard, "/host" + f.standard} {
			if !strings.Contains(e.Details, filepath.Join(root, path)) {
				t.Errorf("%s without %s: %q does not name %s", verb, f.what, e.Details, filepath.Join(root, path))
			}
		}
		return e
	}

	if e := namesBoth("STATUS", p.Status(args), statusFile); e.Code != types.ErrPluginNotAvailable {
		t.Errorf("STATUS without a status file: code %d, want %d", e.Code, types.ErrPluginNotAvailable)
	}
	_, err = p.entry(args, r)
	if e := namesBoth("the allocation lookup", err, kubeconfigFile); e.Code != types.ErrTryAgainLater {
		t.Errorf("allocation lookup without a kubeconfig: code %d, want %d", e.Code, types.ErrTryAgainLater)
	}
	if used != "" {
		t.Errorf("kubeconfig %q used, none exists", used)
	}

	write(t, filepath.Join(root, "/host", DefaultStatusFile), `{"ready":true,"exhaustedNetworks":[]}`)
	write(t, filepath.Join(root, "/host", DefaultKubeconfig), "")
	if err := p.Status(args); err != nil {
		t.Errorf("STATUS with the status file under /host: %v", err)
	}
	if a, err := p.entry(args, r); err != nil || a.Network != "ns_a" || used != filepath.Join(root, "/host", DefaultKubeconfig) {
		t.Errorf("allocation lookup with the kubeconfig under /host: %+v, %v; kubeconfig used %q", a, err, used)
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
