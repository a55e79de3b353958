// Package audit implements "kvnet audit": it reads the cluster once and
// reports every inconsistency internal/audit finds (duplicate IPs or MACs
// on a network, leaked IPAMClaims, pods that disagree with their claim,
// missing NADs, MAC pool problems). It exits 1 with a one-line summary
// when there is any finding, 0 with "no findings" otherwise; -o json
// prints the whole report for scripts.
package audit

import (
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"

	"kvnet.io/kvnet/internal/audit"
	"kvnet.io/kvnet/internal/cli/kubeflags"
	"kvnet.io/kvnet/internal/inventory"
)

// ErrFindings is returned (wrapped, with the summary) when the audit found
// something; the command has then printed the summary itself.
var ErrFindings = errors.New("audit findings")

type options struct {
	conn           kubeflags.Flags
	output         string
	kvnetNamespace string
}

// NewCommand returns "kvnet audit".
func NewCommand() *cobra.Command {
	o := &options{}
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Cross-check kvnet's state in the API: duplicate IPs/MACs, leaked claims, missing NADs",
		Long: "Reads NADs, UDNs, CUDNs, pods, IPAMClaims, VMs, VMIs and the MAC range ConfigMap once and reports:\n" +
			"  DuplicateIP, DuplicateMAC  an address held twice on one network (a pod and its claim are one holder)\n" +
			"  LeakedClaim                an IPAMClaim with no VM, VMI or live (not completed) pod\n" +
			"  ClaimMismatch, MissingClaim  a pod whose addresses disagree with its claim, or whose claim is gone\n" +
			"  MissingNAD, InvalidNAD     NADs referenced but absent, or unreadable\n" +
			"  InvalidAnnotation          a kvnet.io/pod-networks that does not parse\n" +
			"  DuplicateVMMAC, InvalidMACRange  MAC pool state on VMs and its range ConfigMap\n" +
			"  Orphaned                   a claim or live pod left in a namespace that no longer exists\n" +
			"Exits 1 with a one-line summary on stderr if anything is found, 0 with \"no findings\" otherwise.\n" +
			"It checks the API only, not the nodes' datapath.",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return run(cmd, o)
		},
	}
	o.conn.Add(cmd.Flags())
	cmd.Flags().StringVarP(&o.output, "output", "o", "", "output format: json")
	cmd.Flags().StringVar(&o.kvnetNamespace, "kvnet-namespace", inventory.DefaultMACRange.Namespace, "kvnet-controller's namespace (holds the MAC range ConfigMap)")
	return cmd
}

func run(cmd *cobra.Command, o *options) error {
	if o.output != "" && o.output != "json" {
		return fmt.Errorf("unable to match a printer suitable for the output format %q, allowed formats are: json", o.output)
	}
	c, err := o.conn.Client()
	if err != nil {
		return err
	}
	r, err := audit.RunWith(cmd.Context(), c, inventory.LoadOptions{
		MACRange: types.NamespacedName{Namespace: o.kvnetNamespace, Name: inventory.DefaultMACRange.Name}})
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if o.output == "json" {
		b, err := json.MarshalIndent(r, "", "    ")
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s\n", b)
	} else if len(r.Findings) > 0 {
		tw := tabwriter.NewWriter(out, 6, 4, 3, ' ', 0)
		fmt.Fprintln(tw, "KIND\tNETWORK\tOBJECT\tDETAIL")
		for _, f := range r.Findings {
			network := f.Network
			if network == "" {
				network = "<none>"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Kind, network, f.Object, f.Detail)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	counts := fmt.Sprintf("checked %d pods, %d claims, %d allocations, %d networks, %d VMs",
		r.Checked.Pods, r.Checked.Claims, r.Checked.Allocations, r.Checked.Networks, r.Checked.VMs)
	if len(r.Findings) == 0 {
		if o.output != "json" {
			fmt.Fprintf(out, "no findings (%s)\n", counts)
		}
		return nil
	}
	// The summary is the error's one line; cobra would prefix "Error: ".
	cmd.SilenceErrors = true
	fmt.Fprintf(cmd.ErrOrStderr(), "audit: %s (%s)\n", r.Summary(), counts)
	return fmt.Errorf("%w: %s", ErrFindings, r.Summary())
}
