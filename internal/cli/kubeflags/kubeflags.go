// Package kubeflags gives kvnet's cluster commands (get, audit, why) kubectl's
// way of finding a cluster: --kubeconfig, else the files in KUBECONFIG,
// else ~/.kube/config (client-go's clientcmd loading rules, as kubectl
// uses them), --context to pick a context, and the context's namespace
// unless -n says otherwise.
package kubeflags

import (
	"fmt"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/inventory"
)

// Flags are the connection flags.
type Flags struct {
	Kubeconfig string
	Context    string
	// Namespace is -n; "" means the context's namespace (or "default").
	Namespace string
}

// Add registers --kubeconfig and --context.
func (f *Flags) Add(fs *pflag.FlagSet) {
	fs.StringVar(&f.Kubeconfig, "kubeconfig", "", "path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
	fs.StringVar(&f.Context, "context", "", "the kubeconfig context to use")
}

// AddNamespace registers -n/--namespace.
func (f *Flags) AddNamespace(fs *pflag.FlagSet) {
	fs.StringVarP(&f.Namespace, "namespace", "n", "", "the namespace (default: the context's namespace)")
}

func (f *Flags) clientConfig() clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.Kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: f.Context}
	overrides.Context.Namespace = f.Namespace
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
}

// ResolvedNamespace is -n, else the context's namespace, else "default".
func (f *Flags) ResolvedNamespace() (string, error) {
	ns, _, err := f.clientConfig().Namespace()
	if err != nil {
		return "", fmt.Errorf("resolve namespace: %w", err)
	}
	return ns, nil
}

// RESTConfig returns the connection to the cluster the flags select.
func (f *Flags) RESTConfig() (*rest.Config, error) {
	cfg, err := f.clientConfig().ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	return cfg, nil
}

// Client returns a client for the cluster, knowing every type the
// inventory reads.
func (f *Flags) Client() (client.Client, error) {
	cfg, err := f.RESTConfig()
	if err != nil {
		return nil, err
	}
	scheme, err := inventory.Scheme()
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", cfg.Host, err)
	}
	return c, nil
}
