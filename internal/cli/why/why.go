// Package why implements "kvnet why (pod|vm|vmi) NAME": it walks the chain
// kvnet builds for a pod or a KubeVirt VM — namespace, network, NAD,
// bindings and webhooks (VMs), IPAMClaim, addresses and MAC, the node's
// kvnet-node — and prints the first broken link in plain words with its
// fix, or the whole chain when it is healthy. It exits 0 only when the
// chain is healthy.
//
// The checks are pure functions over objects read once from the API
// (collect.go reads; network.go, pod.go, vm.go, webhook.go, node.go
// judge), so each reason is testable without a cluster. kvnet why only
// reads.
package why

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/cli/kubeflags"
	"kvnet.io/kvnet/internal/k8s/manager"
)

// BrokenError is returned by the command when the chain is broken: the
// command's exit status is then non-zero.
type BrokenError struct {
	Subject string
	Code    Code
}

func (e *BrokenError) Error() string { return fmt.Sprintf("%s: %s", e.Subject, e.Code) }

// Options configures Diagnose.
type Options struct {
	// KvnetNamespace is where kvnet-controller keeps its Secret and lease
	// (default kvnet-system).
	KvnetNamespace string
	// Now is the clock (certificate validity, ages); default time.Now.
	Now func() time.Time
}

// Diagnose walks the chain of a pod, VM or VMI (kind "pod", "vm", "vmi")
// and returns the report. An error means the chain could not be read (the
// object does not exist, the API refused a read).
func Diagnose(ctx context.Context, c client.Client, kind, namespace, name string, opts Options) (*Report, error) {
	if opts.KvnetNamespace == "" {
		opts.KvnetNamespace = "kvnet-system"
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	k := &collector{c: c, kvnetNS: opts.KvnetNamespace, now: opts.Now()}
	r := &Report{Subject: fmt.Sprintf("%s %s/%s", kind, namespace, name)}
	switch kind {
	case "pod":
		var pod corev1.Pod
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &pod); err != nil {
			return nil, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
		}
		f, err := k.podFacts(ctx, &pod, nil)
		if err != nil {
			return nil, err
		}
		if f.VM != nil {
			wf, err := k.webhookFacts(ctx)
			if err != nil {
				return nil, err
			}
			f.Webhook = &wf
		}
		diagnosePod(r, f, nil)
	case "vm", "vmi":
		f, err := k.vmFacts(ctx, kind, namespace, name)
		if err != nil {
			return nil, err
		}
		diagnoseVM(r, f)
	default:
		return nil, fmt.Errorf("unknown kind %q: want pod, vm or vmi", kind)
	}
	return r, nil
}

// kinds maps accepted spellings to the kinds Diagnose knows.
var kinds = map[string]string{
	"pod": "pod", "pods": "pod", "po": "pod",
	"vm": "vm", "vms": "vm", "virtualmachine": "vm", "virtualmachines": "vm",
	"vmi": "vmi", "vmis": "vmi", "virtualmachineinstance": "vmi", "virtualmachineinstances": "vmi",
}

type flagpole struct {
	kube           kubeflags.Flags
	kvnetNamespace string
	timeout        time.Duration
}

// NewCommand returns "kvnet why".
func NewCommand() *cobra.Command {
	fl := &flagpole{}
	cmd := &cobra.Command{
		Use:   "why (pod|vm|vmi) NAME",
		Short: "Say why a pod or VM has no working kvnet network: the first broken link and its fix",
		Long: "kvnet why walks the chain kvnet builds for a pod, VM or VMI (namespace, network, NAD,\n" +
			"bindings and webhooks for VMs, IPAMClaim, IPs and MAC, the node's kvnet-node) and prints\n" +
			"the first broken link with a stable code, what is wrong and how to fix it. It exits 0\n" +
			"when the chain is healthy and prints it; non-zero otherwise. See docs/operate.md.\n\n" +
			"The kubeconfig is found as kubectl finds it (--kubeconfig, $KUBECONFIG, ~/.kube/config).",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return run(cmd.Context(), cmd.OutOrStdout(), fl, args[0], args[1])
		},
	}
	fl.kube.Add(cmd.Flags())
	fl.kube.AddNamespace(cmd.Flags())
	cmd.Flags().StringVar(&fl.kvnetNamespace, "kvnet-namespace", "kvnet-system", "namespace kvnet-controller runs in")
	cmd.Flags().DurationVar(&fl.timeout, "timeout", 30*time.Second, "how long the API reads may take")
	return cmd
}

func run(ctx context.Context, out io.Writer, fl *flagpole, kindArg, name string) error {
	kind, ok := kinds[kindArg]
	if !ok {
		return fmt.Errorf("unknown kind %q: want pod, vm or vmi", kindArg)
	}
	cfg, err := fl.kube.RESTConfig()
	if err != nil {
		return err
	}
	namespace, err := fl.kube.ResolvedNamespace()
	if err != nil {
		return err
	}
	scheme, err := manager.NewScheme()
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("connect to the API server: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, fl.timeout)
	defer cancel()
	r, err := Diagnose(ctx, c, kind, namespace, name, Options{KvnetNamespace: fl.kvnetNamespace})
	if err != nil {
		return err
	}
	r.Print(out)
	if r.Problem != nil {
		return &BrokenError{Subject: r.Subject, Code: r.Problem.Code}
	}
	return nil
}
