package node

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

func TestInstallCNI(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, []byte("#!/bin/sh\necho plugin\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := InstallCNI(src, bin); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"kvnet-cni", "kvnet-ipam"} {
		fi, err := os.Stat(filepath.Join(bin, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o755 || fi.Size() != 22 {
			t.Errorf("%s: mode %v size %d", name, fi.Mode(), fi.Size())
		}
	}
	entries, _ := os.ReadDir(bin)
	if len(entries) != 2 {
		t.Errorf("bin dir holds %d entries (temporary files left?)", len(entries))
	}
	if err := InstallCNI(filepath.Join(dir, "missing"), bin); err == nil {
		t.Error("installing a missing binary succeeded")
	}
}

func TestWriteCNIKubeconfig(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("tok-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := &rest.Config{Host: "https://10.96.0.1:443", BearerTokenFile: token}
	cfg.CAData = []byte("ca-bytes")
	path := filepath.Join(dir, "kvnet.d", "kvnet.kubeconfig")
	check := func(wantChanged bool, wantToken string) {
		t.Helper()
		changed, err := WriteCNIKubeconfig(path, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if changed != wantChanged {
			t.Errorf("changed = %v, want %v", changed, wantChanged)
		}
		kc, err := clientcmd.LoadFromFile(path)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := clientcmd.NewDefaultClientConfig(*kc, nil).ClientConfig()
		if err != nil {
			t.Fatal(err)
		}
		if rc.Host != cfg.Host || rc.BearerToken != wantToken || string(rc.CAData) != "ca-bytes" {
			t.Errorf("kubeconfig host %q token %q ca %q", rc.Host, rc.BearerToken, rc.CAData)
		}
	}
	check(true, "tok-1")
	check(false, "tok-1") // unchanged: not rewritten
	if err := os.WriteFile(token, []byte("tok-2"), 0o600); err != nil {
		t.Fatal(err)
	}
	check(true, "tok-2") // the projected token rotated
}
