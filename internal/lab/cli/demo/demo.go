// Package demo implements "kvnet-lab demo": it applies the manifests in
// examples/ to a running lab, as a user would, and prints what kvnet made of
// them: the networks and their conditions, the rendered
// NetworkAttachmentDefinitions, the API server's message for every
// manifest it rejected, and, on a lab with simulated nodes, the pods and
// the traffic between them (checked: the demo fails if a network leaks or
// does not connect, and if a check cannot be made: a pod it expects is
// missing, a probe cannot run, or the source of an isolation check fails
// its positive control).
package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/lab/controlplane"
	"kvnet.io/kvnet/internal/manifests"
	"kvnet.io/kvnet/internal/udn"
)

type flagpole struct {
	kubeconfig string
	examples   string
	timeout    time.Duration
}

// NewCommand returns "kvnet-lab demo".
func NewCommand() *cobra.Command {
	flags := &flagpole{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Apply examples/ to the lab and show what kvnet did with them",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return run(cmd.Context(), cmd.OutOrStdout(), flags)
		},
	}
	cmd.Flags().StringVar(&flags.kubeconfig, "kubeconfig", ".local/kubeconfig", "kubeconfig of the lab")
	cmd.Flags().StringVar(&flags.examples, "examples", "examples", "directory of manifests to apply")
	cmd.Flags().DurationVar(&flags.timeout, "timeout", 30*time.Second, "how long to wait for networks to settle")
	return cmd
}

func run(ctx context.Context, out io.Writer, flags *flagpole) error {
	restCfg, err := clientcmd.BuildConfigFromFlags("", flags.kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig %q (is the lab up? make local-up): %w", flags.kubeconfig, err)
	}
	scheme, err := manager.NewScheme()
	if err != nil {
		return err
	}
	c, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	// Preflight: on a lab with simulated nodes the demo probes from inside
	// pod namespaces; what it needs for that must be there before anything
	// is applied, not found missing later as a probe that "did not reach".
	simulated, err := simulatedNodes(ctx, c)
	if err != nil {
		return fmt.Errorf("list nodes (is the lab up? make local-up): %w", err)
	}
	var tl tools
	if simulated > 0 {
		if os.Geteuid() != 0 {
			return errors.New("the lab has simulated nodes: probing from their pods needs root (ip netns exec)")
		}
		if tl, err = lookTools(exec.LookPath); err != nil {
			return err
		}
	}
	files, err := filepath.Glob(filepath.Join(flags.examples, "*.yaml"))
	if err != nil {
		return err
	}
	slices.Sort(files)

	fmt.Fprintf(out, "== Applying %s/ (server-side apply, as kubectl apply --server-side)\n", flags.examples)
	rejected := 0
	// What the demo applied: it waits for and checks these alone, not
	// whatever else (a user's own pods, VMs, networks) the lab holds.
	applied := appliedSet{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		objs, err := manifests.Decode(data)
		if err != nil {
			return fmt.Errorf("decode %s: %w", f, err)
		}
		for _, o := range objs {
			id := o.GetKind() + " " + key(o.GetNamespace(), o.GetName())
			if err := controlplane.Apply(ctx, c, o); err != nil {
				if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) && !apierrors.IsBadRequest(err) {
					return fmt.Errorf("apply %s from %s: %w", id, f, err)
				}
				rejected++
				fmt.Fprintf(out, "  REJECTED %-45s (%s)\n", id, filepath.Base(f))
				for _, line := range causes(err) {
					fmt.Fprintf(out, "           %s\n", line)
				}
				continue
			}
			applied.add(o.GetKind(), o.GetNamespace(), o.GetName())
			fmt.Fprintf(out, "  applied  %-45s (%s)\n", id, filepath.Base(f))
		}
	}

	if err := waitSettled(ctx, c, applied, flags.timeout); err != nil {
		fmt.Fprintf(out, "warning: %v\n", err)
	}
	if err := printNetworks(ctx, out, c); err != nil {
		return err
	}
	if err := printNADs(ctx, out, c); err != nil {
		return err
	}
	if err := printVMs(ctx, out, c); err != nil {
		return err
	}
	if simulated == 0 {
		fmt.Fprintf(out, "\n== Traffic: the lab has no simulated nodes (they need root), so no pod runs\n")
	} else if err := printTraffic(ctx, out, c, applied, filepath.Dir(flags.kubeconfig), simulated, flags.timeout, execProber{tools: tl}, tl); err != nil {
		return err
	}
	fmt.Fprintf(out, "\n%d manifest(s) rejected by the API server, as expected for examples/*invalid*.\n", rejected)
	return nil
}

func key(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

// causes returns the validation messages of an API error, one per line.
func causes(err error) []string {
	var status apierrors.APIStatus
	if s, ok := err.(apierrors.APIStatus); ok { //nolint:errorlint // APIStatus is implemented by *StatusError directly.
		status = s
	}
	if status == nil || status.Status().Details == nil || len(status.Status().Details.Causes) == 0 {
		return []string{err.Error()}
	}
	var out []string
	for _, c := range status.Status().Details.Causes {
		out = append(out, fmt.Sprintf("%s: %s", c.Field, c.Message))
	}
	return out
}

// appliedSet is what the demo applied, by kind and namespace/name.
type appliedSet map[string]bool

func (a appliedSet) add(kind, ns, name string)      { a[kind+" "+key(ns, name)] = true }
func (a appliedSet) has(kind, ns, name string) bool { return a[kind+" "+key(ns, name)] }

// waitSettled waits until every UDN and CUDN the demo applied has a
// NetworkCreated condition.
func waitSettled(ctx context.Context, c client.Client, applied appliedSet, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pending, err := unsettled(ctx, c, applied)
		if err != nil {
			return err
		}
		if len(pending) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("networks without a NetworkCreated condition after %s: %v", timeout, pending)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func unsettled(ctx context.Context, c client.Client, applied appliedSet) ([]string, error) {
	var udns udnv1.UserDefinedNetworkList
	if err := c.List(ctx, &udns); err != nil {
		return nil, err
	}
	var cudns udnv1.ClusterUserDefinedNetworkList
	if err := c.List(ctx, &cudns); err != nil {
		return nil, err
	}
	var pending []string
	for _, u := range udns.Items {
		if applied.has("UserDefinedNetwork", u.Namespace, u.Name) && meta.FindStatusCondition(u.Status.Conditions, "NetworkCreated") == nil {
			pending = append(pending, key(u.Namespace, u.Name))
		}
	}
	for _, u := range cudns.Items {
		if applied.has("ClusterUserDefinedNetwork", "", u.Name) && meta.FindStatusCondition(u.Status.Conditions, "NetworkCreated") == nil {
			pending = append(pending, u.Name)
		}
	}
	return pending, nil
}

func printNetworks(ctx context.Context, out io.Writer, c client.Client) error {
	var udns udnv1.UserDefinedNetworkList
	if err := c.List(ctx, &udns); err != nil {
		return err
	}
	var cudns udnv1.ClusterUserDefinedNetworkList
	if err := c.List(ctx, &cudns); err != nil {
		return err
	}
	fmt.Fprintf(out, "\n== Networks and their NetworkCreated condition\n")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tNAME\tTOPOLOGY\tROLE\tSTATUS\tREASON\tMESSAGE")
	row := func(kind, name string, s udn.Spec, conds []metav1.Condition) {
		role := "Secondary"
		if s.IsPrimary() {
			role = "Primary"
		}
		status, reason, msg := "-", "-", "-"
		for _, cnd := range conds {
			if cnd.Type == "NetworkCreated" {
				status, reason, msg = string(cnd.Status), cnd.Reason, cnd.Message
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", kind, name, s.Topology, role, status, reason, msg)
	}
	for _, u := range udns.Items {
		row("UDN", key(u.Namespace, u.Name), udn.SpecOfUDN(&u), u.Status.Conditions)
	}
	for _, u := range cudns.Items {
		row("CUDN", u.Name, udn.SpecOfCUDN(&u), u.Status.Conditions)
	}
	return tw.Flush()
}

func printNADs(ctx context.Context, out io.Writer, c client.Client) error {
	var nads nadv1.NetworkAttachmentDefinitionList
	if err := c.List(ctx, &nads, client.HasLabels{udn.NADLabel}); err != nil {
		return err
	}
	fmt.Fprintf(out, "\n== NetworkAttachmentDefinitions rendered by kvnet (%d)\n", len(nads.Items))
	for _, nad := range nads.Items {
		fmt.Fprintf(out, "-- %s/%s  network-id=%s  finalizers=%s\n", nad.Namespace, nad.Name,
			nad.Annotations[udn.NetworkIDAnnotation], strings.Join(nad.Finalizers, ","))
		var buf bytes.Buffer
		if err := json.Indent(&buf, []byte(nad.Spec.Config), "   ", "  "); err != nil {
			fmt.Fprintf(out, "   %s\n", nad.Spec.Config)
			continue
		}
		fmt.Fprintf(out, "   %s\n", buf.String())
	}
	return nil
}

func printVMs(ctx context.Context, out io.Writer, c client.Client) error {
	var vms kubevirtv1.VirtualMachineList
	if err := c.List(ctx, &vms); err != nil {
		return err
	}
	fmt.Fprintf(out, "\n== VirtualMachines: interface MACs (from kvnet's MAC pool where not set)\n")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VM\tINTERFACE\tBINDING\tMAC")
	for _, vm := range vms.Items {
		if vm.Spec.Template == nil {
			continue
		}
		for _, i := range vm.Spec.Template.Spec.Domain.Devices.Interfaces {
			binding := "bridge"
			switch {
			case i.Masquerade != nil:
				binding = "masquerade"
			case i.Binding != nil:
				binding = i.Binding.Name
			}
			mac := i.MacAddress
			if mac == "" {
				mac = "(the pod's, from kvnet IPAM)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", key(vm.Namespace, vm.Name), i.Name, binding, mac)
		}
	}
	return tw.Flush()
}
