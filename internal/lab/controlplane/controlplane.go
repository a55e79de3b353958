// Package controlplane runs a real Kubernetes control plane on this machine:
// etcd, kube-apiserver and kube-controller-manager (garbage collector and
// namespace controllers), built from their Go modules by hack/build-tools.sh.
//
// It exists so that kvnet's controllers and webhooks are tested against the
// real API machinery (CEL validation, admission, owner references, namespace
// deletion) rather than fakes, and so that the lab runs the same thing. It
// uses controller-runtime's envtest to start etcd and the apiserver, and adds
// kube-controller-manager, which envtest does not run.
//
// Its processes die with the process that started them, even one killed
// with SIGKILL (see spawn.go: a parent-death signal, etcd and
// kube-apiserver through util-linux's setpriv), and Start names a process
// still holding a kept etcd data directory rather than timing out on its
// lock ([ProcessesUsing]).
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"kvnet.io/kvnet/internal/manifests"
	"kvnet.io/kvnet/internal/repo"
)

// BinDirEnv names the environment variable that overrides where the
// control-plane binaries are looked up.
const BinDirEnv = "KVNET_BIN_DIR"

// ErrBinariesMissing is returned by Start when etcd, kube-apiserver or
// kube-controller-manager has not been built yet.
var ErrBinariesMissing = errors.New("control-plane binaries missing (run hack/build-tools.sh or make tools)")

// Config configures a control plane.
type Config struct {
	// BinDir holds etcd, kube-apiserver and kube-controller-manager.
	// Empty means $KVNET_BIN_DIR, else <repo>/.cache/bin.
	BinDir string
	// CRDs are installed (and waited for) before Start returns.
	CRDs []*apiextensionsv1.CustomResourceDefinition
	// Manifests are YAML documents server-side applied after the CRDs, such
	// as admission policies.
	Manifests [][]byte
	// WebhookDirs are directories of webhook configurations; envtest rewrites
	// them to point at a local webhook server (see Env.WebhookInstallOptions).
	WebhookDirs []string
	// NoControllerManager skips kube-controller-manager.
	NoControllerManager bool
	// LogDir receives kube-apiserver's and kube-controller-manager's logs;
	// empty discards the API server's and keeps the controller manager's in
	// the control plane's scratch directory.
	LogDir string
	// EtcdDataDir keeps etcd's data across runs (the lab's objects survive
	// a restart); empty is a temporary directory removed on Stop.
	EtcdDataDir string
	// APIServerArgs set further kube-apiserver flags (name without dashes
	// → value), e.g. the real-cluster lab's
	// kubelet-preferred-address-types.
	APIServerArgs map[string]string
	// Controllers are further kube-controller-manager controllers to run
	// beside the garbage collector, namespace and EndpointSlice ones, e.g.
	// the real-cluster lab's nodelifecycle.
	Controllers []string
	// InCluster, when set, serves the API server to pods (see InCluster):
	// the real-cluster lab sets it; nil keeps envtest's loopback-only
	// server without ServiceAccount admission.
	InCluster *InCluster
}

// ControlPlane is a running control plane.
type ControlPlane struct {
	// Env is the envtest environment running etcd and kube-apiserver.
	Env *envtest.Environment
	// Config is an admin (system:masters) client configuration.
	Config *rest.Config
	// Kubeconfig is an admin kubeconfig file's contents.
	Kubeconfig []byte

	kcm     *exec.Cmd
	helpers []*Helper // Spawn's
	apiLog  *os.File  // kube-apiserver's log in Config.LogDir, or nil
	dir     string    // scratch directory owned by the control plane
	certDir string    // kube-apiserver's certificates, under dir
	spawner *Spawner  // forks every child (see spawn.go)
	// inCluster: the certificate directory holds InCluster's CA and
	// keys, and kube-controller-manager runs its controllers.
	inCluster bool
}

// ServiceCIDR is the lab's and tests' IPv4 Service cluster IP range, and
// ServiceCIDR6 their IPv6 one: the cluster is dual-stack, so Services
// with ipFamilyPolicy PreferDualStack or RequireDualStack, or an IPv6
// single stack, get IPv6 cluster IPs; others keep one IPv4 cluster IP.
const (
	ServiceCIDR  = "10.96.0.0/16"
	ServiceCIDR6 = "fd00:10:96::/112"
)

// Start starts etcd, kube-apiserver and (unless disabled)
// kube-controller-manager, installs the CRDs and waits until they are served.
func Start(ctx context.Context, cfg Config) (*ControlPlane, error) {
	binDir, err := resolveBinDir(cfg.BinDir)
	if err != nil {
		return nil, err
	}
	// The API server's certificates and service-account keys live in a
	// directory of ours rather than one envtest removes on stop, so that
	// RestartAPIServer brings back a server every issued kubeconfig and
	// token still works with.
	dir, err := os.MkdirTemp("", "kvnet-controlplane-")
	if err != nil {
		return nil, err
	}
	certDir := filepath.Join(dir, "apiserver")
	if err := os.Mkdir(certDir, 0o700); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	setpriv, err := setprivBinary()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	wrapDir := filepath.Join(dir, "bin")
	if err := os.Mkdir(wrapDir, 0o755); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	wrapped := map[string]string{}
	for _, name := range []string{"etcd", "kube-apiserver"} {
		if wrapped[name], err = writeDeathWrapper(wrapDir, name, setpriv, filepath.Join(binDir, name)); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory:    wrapDir,
		CRDs:                     cfg.CRDs,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	if len(cfg.WebhookDirs) > 0 {
		env.WebhookInstallOptions.Paths = cfg.WebhookDirs
	}
	if cfg.EtcdDataDir != "" {
		if err := os.MkdirAll(cfg.EtcdDataDir, 0o700); err != nil {
			return nil, fmt.Errorf("etcd data directory: %w", err)
		}
		if err := checkStaleEtcd(cfg.EtcdDataDir); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		env.ControlPlane.Etcd = &envtest.Etcd{DataDir: cfg.EtcdDataDir}
	}
	if env.ControlPlane.Etcd == nil {
		env.ControlPlane.Etcd = &envtest.Etcd{}
	}
	env.ControlPlane.Etcd.Path = wrapped["etcd"]
	env.ControlPlane.APIServer = &envtest.APIServer{CertDir: certDir, Path: wrapped["kube-apiserver"]}
	// Cluster IPs from kubeadm's default range, not envtest's 10.0.0.0/24,
	// which examples' UDN subnets use: a Service's cluster IP inside a UDN
	// subnet is reached on-link, never through the network's router.
	env.ControlPlane.APIServer.Configure().Set("service-cluster-ip-range", ServiceCIDR+","+ServiceCIDR6)
	if cfg.InCluster != nil {
		if err := cfg.InCluster.configure(env.ControlPlane.APIServer, certDir); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	for k, v := range cfg.APIServerArgs {
		env.ControlPlane.APIServer.Configure().Set(k, v)
	}
	var apiLog *os.File
	if cfg.LogDir != "" {
		// Appended to across restarts (RestartAPIServer keeps the writer).
		apiLog, err = os.OpenFile(filepath.Join(cfg.LogDir, "kube-apiserver.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("kube-apiserver log: %w", err)
		}
		env.ControlPlane.APIServer.Out, env.ControlPlane.APIServer.Err = apiLog, apiLog
	}
	sp := NewSpawner()
	var restCfg *rest.Config
	err = sp.Do(func() (err error) {
		restCfg, err = env.Start()
		return err
	})
	if err != nil {
		sp.Stop()
		if apiLog != nil {
			_ = apiLog.Close()
		}
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start etcd and kube-apiserver: %w", err)
	}
	cp := &ControlPlane{Env: env, Config: restCfg, dir: dir, certDir: certDir, apiLog: apiLog, spawner: sp, inCluster: cfg.InCluster != nil}
	ok := false
	defer func() {
		if !ok {
			_ = cp.Stop()
		}
	}()

	admin, err := env.ControlPlane.AddUser(envtest.User{Name: "kvnet-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, fmt.Errorf("create admin user: %w", err)
	}
	cp.Kubeconfig, err = admin.KubeConfig()
	if err != nil {
		return nil, fmt.Errorf("render admin kubeconfig: %w", err)
	}
	if len(cfg.Manifests) > 0 {
		c, err := client.New(restCfg, client.Options{})
		if err != nil {
			return nil, err
		}
		for _, m := range cfg.Manifests {
			objs, err := manifests.Decode(m)
			if err != nil {
				return nil, fmt.Errorf("decode manifest: %w", err)
			}
			for _, o := range objs {
				if err := Apply(ctx, c, o); err != nil {
					return nil, fmt.Errorf("apply %s %s: %w", o.GetKind(), o.GetName(), err)
				}
			}
		}
	}
	if !cfg.NoControllerManager {
		if err := cp.startControllerManager(ctx, binDir, cfg.LogDir, cfg.Controllers); err != nil {
			return nil, err
		}
	}
	ok = true
	return cp, nil
}

func (cp *ControlPlane) startControllerManager(ctx context.Context, binDir, logDir string, more []string) error {
	kubeconfig := filepath.Join(cp.dir, "kcm.kubeconfig")
	if err := os.WriteFile(kubeconfig, cp.Kubeconfig, 0o600); err != nil {
		return err
	}
	// The garbage collector makes owner references behave as in a
	// cluster; the namespace controller makes namespace deletion finish;
	// the EndpointSlice controller lists Services' pods, as kvnet's mirror
	// controller expects.
	controllers := append([]string{"garbagecollector", "namespace", "endpointslice"}, more...)
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--secure-port=0",
		"--leader-elect=false",
		"--concurrent-gc-syncs=10",
		"--namespace-sync-period=10s",
		"--v=1",
	}
	if cp.inCluster {
		controllers = append(controllers, inClusterControllers...)
		args = append(args, inClusterControllerManagerArgs(cp.certDir)...)
	}
	args = append(args, "--controllers="+strings.Join(controllers, ","))
	cmd := exec.Command(filepath.Join(binDir, "kube-controller-manager"), args...)
	if logDir != "" {
		f, err := os.Create(filepath.Join(logDir, "kube-controller-manager.log"))
		if err != nil {
			return err
		}
		cmd.Stdout, cmd.Stderr = f, f
	} else {
		f, err := os.Create(filepath.Join(cp.dir, "kube-controller-manager.log"))
		if err != nil {
			return err
		}
		cmd.Stdout, cmd.Stderr = f, f
	}
	// It dies with its parent (see spawn.go).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cp.spawner.Do(cmd.Start); err != nil {
		return fmt.Errorf("start kube-controller-manager: %w", err)
	}
	cp.kcm = cmd
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// kube-controller-manager has no port to probe with --secure-port=0; a
	// start-up failure shows as an early exit.
	select {
	case err := <-exited:
		cp.kcm = nil
		return fmt.Errorf("kube-controller-manager exited at start: %v (log in %s)", err, cp.dir)
	case <-time.After(500 * time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// RestartAPIServer kills kube-apiserver with SIGKILL, as a crash of its
// node does, and starts it again on the same address with the same
// certificates and etcd; clients see connection errors meanwhile. It
// returns once the new server answers /healthz.
func (cp *ControlPlane) RestartAPIServer() error {
	pid, err := processWithArg("kube-apiserver", cp.certDir)
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill kube-apiserver (pid %d): %w", pid, err)
	}
	// envtest reaps it; then its Stop has nothing left to wait for.
	for deadline := time.Now().Add(30 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver (pid %d) still there 30s after SIGKILL", pid)
		}
	}
	s := cp.Env.ControlPlane.GetAPIServer()
	// envtest notices the exit from its own wait; until then its Stop
	// signals a process that is gone.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		err := s.Stop()
		if err == nil {
			break
		}
		if (!errors.Is(err, syscall.ESRCH) && !errors.Is(err, os.ErrProcessDone)) || time.Now().After(deadline) {
			return fmt.Errorf("stop kube-apiserver: %w", err)
		}
	}
	if err := cp.spawner.Do(s.Start); err != nil {
		return fmt.Errorf("start kube-apiserver again: %w", err)
	}
	return nil
}

// processWithArg finds the process running the binary named name with an
// argument containing arg.
func processWithArg(name, arg string) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if filepath.Base(args[0]) != name {
			continue
		}
		for _, a := range args[1:] {
			if strings.Contains(a, arg) {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("no %s process with an argument naming %s", name, arg)
}

// Stop stops every process and removes scratch files. It is safe to call
// more than once.
func (cp *ControlPlane) Stop() error {
	var errs []error
	for _, h := range cp.helpers {
		_ = h.cmd.Process.Kill()
		<-h.exited
	}
	cp.helpers = nil
	if cp.kcm != nil && cp.kcm.Process != nil {
		_ = cp.kcm.Process.Kill()
		cp.kcm = nil
	}
	if cp.Env != nil {
		if err := cp.Env.Stop(); err != nil {
			errs = append(errs, err)
		}
		cp.Env = nil
	}
	if cp.spawner != nil {
		cp.spawner.Stop()
		cp.spawner = nil
	}
	if cp.apiLog != nil {
		_ = cp.apiLog.Close()
		cp.apiLog = nil
	}
	if cp.dir != "" {
		_ = os.RemoveAll(cp.dir)
		cp.dir = ""
	}
	return errors.Join(errs...)
}

// defaultBinDir is $KVNET_BIN_DIR, else <repo>/.cache/bin: where
// hack/build-tools.sh puts what it builds.
func defaultBinDir() (string, error) {
	if dir := os.Getenv(BinDirEnv); dir != "" {
		return dir, nil
	}
	root, err := repo.Root()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, ".cache", "bin"), nil
}

// Tool returns the path of hack/build-tools.sh's binary name (helm, say)
// in $KVNET_BIN_DIR, else <repo>/.cache/bin, or an error naming where it
// is missing and what builds it.
func Tool(name string) (string, error) {
	dir, err := defaultBinDir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s: %w (hack/build-tools.sh builds it: make tools)", name, err)
	}
	return p, nil
}

func resolveBinDir(dir string) (string, error) {
	if dir == "" {
		var err error
		if dir, err = defaultBinDir(); err != nil {
			return "", err
		}
	}
	for _, bin := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return "", fmt.Errorf("%w: %s not in %s", ErrBinariesMissing, bin, dir)
		}
	}
	return dir, nil
}

// Helper is a further process Spawn started beside the control plane.
type Helper struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once it exited; then err is set
	err    error
}

// Pid is the helper's process ID.
func (h *Helper) Pid() int { return h.cmd.Process.Pid }

// Exited is closed once the helper has exited; Err then says how.
func (h *Helper) Exited() <-chan struct{} { return h.exited }

// Err is the helper's exit status once Exited is closed.
func (h *Helper) Err() error { return h.err }

// Spawn starts tool name (a binary of the control plane's bin directory,
// such as kube-scheduler or kwok) with args, its output in logPath. Like
// kube-controller-manager it dies with this process and is killed by
// Stop; an exit within half a second is a start-up failure.
func (cp *ControlPlane) Spawn(ctx context.Context, name string, args []string, logPath string) (*Helper, error) {
	bin, err := Tool(name)
	if err != nil {
		return nil, err
	}
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cp.spawner.Do(cmd.Start); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	h := &Helper{cmd: cmd, exited: make(chan struct{})}
	go func() {
		h.err = cmd.Wait()
		f.Close()
		close(h.exited)
	}()
	cp.helpers = append(cp.helpers, h)
	select {
	case <-h.exited:
		return nil, fmt.Errorf("%s exited at start: %v (log %s)", name, h.err, logPath)
	case <-time.After(500 * time.Millisecond):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return h, nil
}

// AdminKubeconfig writes the admin kubeconfig into the control plane's
// scratch directory (once) and returns its path, for helpers' flags.
func (cp *ControlPlane) AdminKubeconfig() (string, error) {
	p := filepath.Join(cp.dir, "admin.kubeconfig")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	return p, os.WriteFile(p, cp.Kubeconfig, 0o600)
}
