package node

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"kvnet.io/kvnet/internal/netconf"
)

// InstallCNI copies the kvnet-cni binary src into binDir as kvnet-cni and
// as kvnet-ipam (IPAM-only mode is the same binary), each atomically (a
// runtime never executes a half-written plugin).
func InstallCNI(src, binDir string) error {
	for _, name := range []string{netconf.PluginType, netconf.IPAMType} {
		if err := copyFile(src, filepath.Join(binDir, name), 0o755); err != nil {
			return fmt.Errorf("install %s into %s: %w", name, binDir, err)
		}
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+"-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

// WriteCNIKubeconfig writes the kubeconfig kvnet-cni uses (it runs on the
// host, outside any pod): cfg's server and CA, and the bearer token read
// now from cfg's token file. It reports whether the file changed; writing
// it again after the projected token rotates keeps the plugin working.
func WriteCNIKubeconfig(path string, cfg *rest.Config) (bool, error) {
	token := []byte(cfg.BearerToken)
	if cfg.BearerTokenFile != "" {
		var err error
		if token, err = os.ReadFile(cfg.BearerTokenFile); err != nil {
			return false, fmt.Errorf("read service account token: %w", err)
		}
	}
	ca := cfg.CAData
	if len(ca) == 0 && cfg.CAFile != "" {
		var err error
		if ca, err = os.ReadFile(cfg.CAFile); err != nil {
			return false, fmt.Errorf("read API server CA: %w", err)
		}
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["cluster"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: ca, InsecureSkipTLSVerify: cfg.Insecure}
	kc.AuthInfos["kvnet-cni"] = &clientcmdapi.AuthInfo{Token: string(bytes.TrimSpace(token)),
		ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["kvnet-cni"] = &clientcmdapi.Context{Cluster: "cluster", AuthInfo: "kvnet-cni"}
	kc.CurrentContext = "kvnet-cni"
	b, err := clientcmd.Write(*kc)
	if err != nil {
		return false, err
	}
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, b) {
		return false, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return false, err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return false, err
	}
	return true, os.Rename(tmp, path)
}

// keepCNIKubeconfig rewrites the kubeconfig every minute until ctx ends.
func keepCNIKubeconfig(ctx context.Context, path string, cfg *rest.Config) {
	logger := log.FromContext(ctx)
	for {
		if changed, err := WriteCNIKubeconfig(path, cfg); err != nil {
			logger.Error(err, "write kvnet-cni kubeconfig", "path", path)
		} else if changed {
			logger.Info("wrote kvnet-cni kubeconfig", "path", path)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Minute):
		}
	}
}
