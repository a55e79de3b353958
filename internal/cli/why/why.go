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
//
// "kvnet why connection SRC DST" (connection.go) says whether the
// policies of the network two endpoints share allow a connection, by
// compiling what the API says with kvnet-node's compiler (package policy)
// and naming the allowing rule or the isolating policies.
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
	conn           ConnOptions
	port           int
}

// NewCommand returns "kvnet why".
func NewCommand() *cobra.Command {
	fl := &flagpole{}
	cmd := &cobra.Command{
		Use:   "why (pod|vm|vmi) NAME | why connection SRC DST",
		Short: "Say why a pod or VM has no working kvnet network, or whether policy allows a connection",
		Long: "kvnet why walks the chain kvnet builds for a pod, VM or VMI (namespace, network, NAD,\n" +
			"bindings and webhooks for VMs, IPAMClaim, IPs and MAC, the node's kvnet-node) and prints\n" +
			"the first broken link with a stable code, what is wrong and how to fix it. It exits 0\n" +
			"when the chain is healthy and prints it; non-zero otherwise. See docs/operate.md.\n\n" +
			"kvnet why connection SRC DST (each <namespace>/<pod or vm>, or a name in -n's namespace)\n" +
			"says whether the policies of the network both share allow SRC to open a connection to DST\n" +
			"(--protocol, --port; no port: any port), naming the allowing rule, or the policies that\n" +
			"isolate the source (egress) or destination (ingress) when refused. Exit 0 when allowed.\n\n" +
			"The kubeconfig is found as kubectl finds it (--kubeconfig, $KUBECONFIG, ~/.kube/config).",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 && connKinds[args[0]] {
				return cobra.ExactArgs(3)(cmd, args)
			}
			return cobra.ExactArgs(2)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if connKinds[args[0]] {
				return runConnection(cmd.Context(), cmd.OutOrStdout(), fl, args[1], args[2])
			}
			return run(cmd.Context(), cmd.OutOrStdout(), fl, args[0], args[1])
		},
	}
	fl.kube.Add(cmd.Flags())
	fl.kube.AddNamespace(cmd.Flags())
	cmd.Flags().StringVar(&fl.kvnetNamespace, "kvnet-namespace", "kvnet-system", "namespace kvnet-controller runs in")
	cmd.Flags().DurationVar(&fl.timeout, "timeout", 30*time.Second, "how long the API reads may take")
	cmd.Flags().IntVar(&fl.port, "port", 0, "connection: destination port (0: any port)")
	cmd.Flags().StringVar(&fl.conn.Protocol, "protocol", "TCP", "connection: TCP, UDP or SCTP")
	cmd.Flags().StringVar(&fl.conn.Network, "network", "", "connection: the shared network to judge, by name or NAD (namespace/name); default the primary one")
	return cmd
}

// connKinds are the spellings of "kvnet why connection".
var connKinds = map[string]bool{"connection": true, "conn": true}

// client returns an API client from the flags.
func (fl *flagpole) client() (client.Client, error) {
	cfg, err := fl.kube.RESTConfig()
	if err != nil {
		return nil, err
	}
	scheme, err := manager.NewScheme()
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("connect to the API server: %w", err)
	}
	return c, nil
}

func runConnection(ctx context.Context, out io.Writer, fl *flagpole, src, dst string) error {
	if fl.port < 0 || fl.port > 65535 {
		return fmt.Errorf("--port %d: want 1..65535, or 0 for any port", fl.port)
	}
	fl.conn.Port = uint16(fl.port)
	namespace, err := fl.kube.ResolvedNamespace()
	if err != nil {
		return err
	}
	c, err := fl.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, fl.timeout)
	defer cancel()
	r, err := DiagnoseConnection(ctx, c, src, dst, namespace, fl.conn)
	if err != nil {
		return err
	}
	r.Print(out)
	if r.Problem != nil {
		return &BrokenError{Subject: r.Subject, Code: r.Problem.Code}
	}
	return nil
}

func run(ctx context.Context, out io.Writer, fl *flagpole, kindArg, name string) error {
	kind, ok := kinds[kindArg]
	if !ok {
		return fmt.Errorf("unknown kind %q: want pod, vm or vmi", kindArg)
	}
	namespace, err := fl.kube.ResolvedNamespace()
	if err != nil {
		return err
	}
	c, err := fl.client()
	if err != nil {
		return err
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
