//go:build cluster

// The checks of what hack/build-cluster-tools.sh builds that need no
// cluster: CoreDNS and the registry are main packages of the repo's own
// (hack/tools/cluster/coredns, hack/tools/cluster/registry) that link only what the lab
// uses, so these tests pin down that it is enough.

package cluster

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kvnet.io/kvnet/internal/testenv"
)

// startTool starts binDir/name with args, logging into the test's
// directory, and stops it when the test ends.
func startTool(t *testing.T, binDir, name string, args ...string) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, name), args...)
	// As the lab starts the registry: no trace exporter to send to.
	cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none", "OTEL_SDK_DISABLED=true")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("%s's log:\n%s", name, b)
		}
	})
}

// corefileDirectives returns the plugin directives of the Corefile in
// manifests/coredns.yaml: the first word of every line directly inside a
// server block.
func corefileDirectives(t *testing.T) []string {
	t.Helper()
	b, err := addonManifests.ReadFile("manifests/coredns.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var directives []string
	in, depth := false, 0
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !in {
			in = line == "Corefile: |"
			continue
		}
		if line == "---" {
			break
		}
		if depth == 1 && line != "" && line != "}" {
			directives = append(directives, strings.Fields(line)[0])
		}
		depth += strings.Count(line, "{") - strings.Count(line, "}")
	}
	if len(directives) == 0 {
		t.Fatal("manifests/coredns.yaml: no Corefile directives found")
	}
	return directives
}

// TestClusterToolsCoreDNS checks that the CoreDNS build links every plugin
// the lab's Corefile names, and that it answers queries: one server block
// answers from hosts, a second forwards to it.
func TestClusterToolsCoreDNS(t *testing.T) {
	testenv.NeedsRoot(t) // the build cache is root's
	binDir := buildTools(t)

	// coredns -plugins prints one linked plugin a line.
	out, err := exec.Command(filepath.Join(binDir, "coredns"), "-plugins").CombinedOutput()
	if err != nil {
		t.Fatalf("coredns -plugins: %v\n%s", err, out)
	}
	linked := map[string]bool{}
	for _, f := range strings.Fields(string(out)) {
		linked[f] = true
	}
	for _, d := range corefileDirectives(t) {
		if !linked[d] {
			t.Errorf("manifests/coredns.yaml's Corefile uses plugin %q, which hack/tools/cluster/coredns/main.go does not link; coredns -plugins:\n%s", d, out)
		}
	}

	hostsPort, fwdPort := testenv.FreePort(t), testenv.FreePort(t)
	corefile := fmt.Sprintf(`.:%d {
    errors
    hosts {
        192.0.2.10 probe.kvnet.test
    }
}
.:%d {
    errors
    cache 30
    loadbalance
    forward . 127.0.0.1:%d
}
`, hostsPort, fwdPort, hostsPort)
	path := filepath.Join(t.TempDir(), "Corefile")
	if err := os.WriteFile(path, []byte(corefile), 0o644); err != nil { //nolint:gosec // a config file
		t.Fatal(err)
	}
	startTool(t, binDir, "coredns", "-conf", path)

	for _, port := range []int{hostsPort, fwdPort} {
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", port))
		}}
		testenv.Eventually(t, time.Minute, fmt.Sprintf("CoreDNS on port %d answers probe.kvnet.test with 192.0.2.10", port), func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			addrs, err := r.LookupHost(ctx, "probe.kvnet.test")
			if err != nil {
				return err
			}
			if len(addrs) != 1 || addrs[0] != "192.0.2.10" {
				return fmt.Errorf("got %v", addrs)
			}
			return nil
		})
	}
}

// TestClusterToolsRegistry checks that the registry build serves the
// registry API with the filesystem storage the lab configures.
func TestClusterToolsRegistry(t *testing.T) {
	testenv.NeedsRoot(t) // the build cache is root's
	binDir := buildTools(t)

	dir := t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	conf := fmt.Sprintf("version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n", filepath.Join(dir, "storage"), addr)
	path := filepath.Join(dir, "registry.yaml")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil { //nolint:gosec // a config file
		t.Fatal(err)
	}
	startTool(t, binDir, "registry", "serve", path)
	testenv.Eventually(t, time.Minute, "the registry answers GET /v2/ with 200", func() error {
		resp, err := http.Get("http://" + addr + "/v2/") //nolint:noctx // a probe
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %s", resp.Status)
		}
		return nil
	})
}
