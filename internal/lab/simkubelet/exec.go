package simkubelet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/go-logr/logr"
)

// nsExec runs CNI plugins inside a named network namespace through
// `ip netns exec`; it implements libcni's invoke.Exec.
type nsExec struct {
	ip    string   // path of the ip binary
	netns string   // namespace name under /run/netns
	env   []string // appended to the environment libcni builds (wins on duplicates)
	log   logr.Logger
}

var _ invoke.Exec = (*nsExec)(nil)

// ExecPlugin runs the plugin with stdinData on stdin and environ (plus the
// extra environment) and returns its stdout. A failing plugin's error JSON
// on stdout is returned as a *types.Error.
func (e *nsExec) ExecPlugin(ctx context.Context, pluginPath string, stdinData []byte, environ []string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, e.ip, "netns", "exec", e.netns, pluginPath)
	cmd.Env = append(append([]string(nil), environ...), e.env...)
	cmd.Stdin = bytes.NewReader(stdinData)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if s := strings.TrimSpace(stderr.String()); s != "" {
		e.log.V(1).Info("plugin stderr", "plugin", filepath.Base(pluginPath), "command", cniCommand(environ), "stderr", s)
	}
	if err != nil {
		return nil, pluginError(pluginPath, e.netns, err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// pluginError turns a failed run into an error: the plugin's own CNI error
// when stdout holds one, else the exit status with stderr.
func pluginError(pluginPath, netns string, runErr error, stdout, stderr []byte) error {
	if len(bytes.TrimSpace(stdout)) > 0 {
		var perr types.Error
		if json.Unmarshal(stdout, &perr) == nil && (perr.Code != 0 || perr.Msg != "") {
			return &perr
		}
	}
	msg := strings.TrimSpace(string(stderr))
	if msg == "" {
		msg = strings.TrimSpace(string(stdout))
	}
	if msg == "" {
		return fmt.Errorf("run plugin %s in netns %s: %w", filepath.Base(pluginPath), netns, runErr)
	}
	return fmt.Errorf("run plugin %s in netns %s: %w: %s", filepath.Base(pluginPath), netns, runErr, msg)
}

func cniCommand(environ []string) string {
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, "CNI_COMMAND="); ok {
			return v
		}
	}
	return ""
}

// FindInPath finds the plugin executable in paths.
func (e *nsExec) FindInPath(plugin string, paths []string) (string, error) {
	return invoke.FindInPath(plugin, paths)
}

// Decode reads a plugin's VERSION output.
func (e *nsExec) Decode(jsonBytes []byte) (version.PluginInfo, error) {
	return (&version.PluginDecoder{}).Decode(jsonBytes)
}
