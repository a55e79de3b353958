// Package get implements "kvnet get networks|ips|claims|vms": kvnet's view
// of a cluster's networks, address allocations, IPAMClaims and VM
// interfaces, printed as kubectl prints (tables with upper-case headers,
// -o wide, -o json|yaml with the rows' documented field names), read once
// from the API through internal/inventory.
package get

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"kvnet.io/kvnet/internal/cli/kubeflags"
	"kvnet.io/kvnet/internal/inventory"
	"kvnet.io/kvnet/internal/migration"
)

type options struct {
	conn          kubeflags.Flags
	allNamespaces bool
	output        string
	selector      string
}

// resources maps every accepted name to its canonical one.
var resources = map[string]string{
	"networks": "networks", "network": "networks", "net": "networks", "nets": "networks",
	"ips": "ips", "ip": "ips", "allocations": "ips",
	"claims": "claims", "claim": "claims", "ipamclaims": "claims", "ipamclaim": "claims",
	"vms": "vms", "vm": "vms", "virtualmachines": "vms", "virtualmachine": "vms",
}

// NewCommand returns "kvnet get".
func NewCommand() *cobra.Command {
	o := &options{}
	cmd := &cobra.Command{
		Use:   "get networks|ips|claims|vms",
		Short: "List kvnet networks, IP allocations, IPAMClaims or VM interfaces",
		Long: "Reads the cluster's NADs, UDNs, CUDNs, pods (kvnet.io/pod-networks), IPAMClaims, VMs and VMIs once\n" +
			"and lists:\n" +
			"  networks  UDNs, CUDNs and kvnet NADs no UDN owns: topology, role, subnets, pool use, NetworkCreated\n" +
			"  ips       every allocation: network, pod (VM, claim), IPs, MAC, node\n" +
			"  claims    IPAMClaims: network, IPs, owner pod, VM, IPsAllocated\n" +
			"  vms       each VM interface: binding, network, IP, MAC, node, claim, migration\n" +
			"The cluster is found as kubectl finds it (--kubeconfig, $KUBECONFIG, ~/.kube/config).",
		Args:         cobra.ExactArgs(1),
		SilenceUsage: true,
		ValidArgs:    []string{"networks", "ips", "claims", "vms"},
		RunE: func(cmd *cobra.Command, args []string) error {
			return run(cmd, o, args[0])
		},
	}
	o.conn.Add(cmd.Flags())
	o.conn.AddNamespace(cmd.Flags())
	cmd.Flags().BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "list across all namespaces")
	cmd.Flags().StringVarP(&o.output, "output", "o", "", "output format: wide, json or yaml")
	cmd.Flags().StringVarP(&o.selector, "selector", "l", "", "label selector (e.g. app=web,tier!=dev) on the listed objects")
	return cmd
}

func run(cmd *cobra.Command, o *options, arg string) error {
	resource, ok := resources[strings.ToLower(arg)]
	if !ok {
		return fmt.Errorf("unknown resource %q: want networks, ips, claims or vms", arg)
	}
	switch o.output {
	case "", "wide", "json", "yaml":
	default:
		return fmt.Errorf("unable to match a printer suitable for the output format %q, allowed formats are: json,wide,yaml", o.output)
	}
	var f inventory.Filter
	if o.selector != "" {
		sel, err := labels.Parse(o.selector)
		if err != nil {
			return fmt.Errorf("selector %q: %w", o.selector, err)
		}
		f.Selector = sel
	}
	if !o.allNamespaces {
		ns, err := o.conn.ResolvedNamespace()
		if err != nil {
			return err
		}
		f.Namespace = ns
	}
	c, err := o.conn.Client()
	if err != nil {
		return err
	}
	inv, err := inventory.Load(cmd.Context(), c, inventory.LoadOptions{})
	if err != nil {
		return err
	}
	var switchovers []corev1.Event
	if resource == "vms" {
		// kvnet-node's switch-over events on VMIs, by reason (a field
		// selector the API server serves for events).
		for _, reason := range []string{migration.EventSwitchover, migration.EventSwitchedByAPI} {
			var evs corev1.EventList
			opts := []client.ListOption{client.MatchingFields{"reason": reason}}
			if f.Namespace != "" {
				opts = append(opts, client.InNamespace(f.Namespace))
			}
			if err := c.List(cmd.Context(), &evs, opts...); err != nil {
				return fmt.Errorf("list %s events: %w", reason, err)
			}
			switchovers = append(switchovers, evs.Items...)
		}
	}
	t := tableOf(inv, resource, f, switchovers)
	out := cmd.OutOrStdout()
	switch o.output {
	case "json":
		b, err := json.MarshalIndent(t.rows, "", "    ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(t.rows)
		if err != nil {
			return err
		}
		_, err = out.Write(b)
		return err
	}
	if len(t.cells) == 0 {
		if f.Namespace == "" {
			fmt.Fprintln(cmd.ErrOrStderr(), "No resources found")
		} else {
			fmt.Fprintf(cmd.ErrOrStderr(), "No resources found in %s namespace.\n", f.Namespace)
		}
		return nil
	}
	return t.print(out, o.output == "wide", o.allNamespaces)
}

// column is a table column; wide columns show with -o wide only. The
// NAMESPACE column (the first) shows with -A only.
type column struct {
	header string
	wide   bool
}

type table struct {
	columns []column
	cells   [][]string // per row, one cell per column
	rows    any        // the row objects, for -o json|yaml
}

func (t *table) print(w io.Writer, wide, allNamespaces bool) error {
	tw := tabwriter.NewWriter(w, 6, 4, 3, ' ', 0)
	line := func(cells []string) {
		var keep []string
		for i, c := range t.columns {
			if (c.wide && !wide) || (i == 0 && c.header == "NAMESPACE" && !allNamespaces) {
				continue
			}
			keep = append(keep, cells[i])
		}
		fmt.Fprintln(tw, strings.Join(keep, "\t"))
	}
	headers := make([]string, len(t.columns))
	for i, c := range t.columns {
		headers[i] = c.header
	}
	line(headers)
	for _, r := range t.cells {
		line(r)
	}
	return tw.Flush()
}

// cell prints an empty value as kubectl does.
func cell(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

func join(l []string) string { return cell(strings.Join(l, ",")) }

func tableOf(inv *inventory.Inventory, resource string, f inventory.Filter, switchovers []corev1.Event) *table {
	switch resource {
	case "networks":
		rows := inv.NetworkRows(f)
		t := &table{rows: nonNil(rows), columns: []column{{"NAMESPACE", false}, {"NAME", false}, {"KIND", false}, {"TOPOLOGY", false},
			{"ROLE", false}, {"SUBNETS", false}, {"POOL", false}, {"NETWORK-CREATED", false},
			{"NETWORK", true}, {"PERSISTENT", true}, {"NETWORK-ID", true}, {"NADS", true}, {"REASON", true}}}
		for _, r := range rows {
			pool := "<none>"
			if r.Pool != nil {
				pool = fmt.Sprintf("%d/%d", r.Pool.Used, r.Pool.Size)
			}
			t.cells = append(t.cells, []string{cell(r.Namespace), r.Name, r.Kind, r.Topology, cell(r.Role), join(r.Subnets), pool,
				cell(r.NetworkCreated), cell(r.Network), strconv.FormatBool(r.PersistentIPs), cell(r.NetworkID), join(r.NADs), cell(r.Reason)})
		}
		return t
	case "ips":
		rows := inv.IPRows(f)
		t := &table{rows: nonNil(rows), columns: []column{{"NAMESPACE", false}, {"NETWORK", false}, {"POD", false}, {"VM", false},
			{"CLAIM", false}, {"IPS", false}, {"MAC", false}, {"NODE", false}, {"NAD", true}, {"ROLE", true}}}
		for _, r := range rows {
			t.cells = append(t.cells, []string{r.Namespace, r.Network, cell(r.Pod), cell(r.VM), cell(r.Claim), join(r.IPs), cell(r.MAC),
				cell(r.Node), cell(r.NAD), cell(r.Role)})
		}
		return t
	case "claims":
		rows := inv.ClaimRows(f)
		t := &table{rows: nonNil(rows), columns: []column{{"NAMESPACE", false}, {"NAME", false}, {"NETWORK", false}, {"IPS", false},
			{"OWNER-POD", false}, {"VM", false}, {"CONDITION", false}, {"REASON", true}, {"INTERFACE", true}, {"PODS", true}}}
		for _, r := range rows {
			t.cells = append(t.cells, []string{r.Namespace, r.Name, r.Network, join(r.IPs), cell(r.OwnerPod), cell(r.VM), cell(r.Condition),
				cell(r.Reason), cell(r.Interface), join(r.Pods)})
		}
		return t
	default:
		rows := inv.VMRows(f)
		inventory.SetSwitchovers(rows, switchovers)
		t := &table{rows: nonNil(rows), columns: []column{{"NAMESPACE", false}, {"VM", false}, {"INTERFACE", false}, {"BINDING", false},
			{"NETWORK", false}, {"IP", false}, {"MAC", false}, {"NODE", false}, {"CLAIM", false}, {"MIGRATION", false},
			{"STATUS", true}, {"NAD", true}, {"POD", true}, {"MIGRATION-SOURCE", true}, {"MIGRATION-TARGET", true}, {"SWITCH-OVER", true}}}
		for _, r := range rows {
			t.cells = append(t.cells, []string{r.Namespace, r.VM, r.Interface, r.Binding, r.Network, join(r.IPs), cell(r.MAC), cell(r.Node),
				cell(r.Claim), cell(r.Migration), cell(r.Status), cell(r.NAD), cell(r.Pod), cell(r.MigrationSource), cell(r.MigrationTarget), cell(r.Switchover)})
		}
		return t
	}
}

// nonNil makes an empty result print as [] rather than null.
func nonNil[T any](rows []T) []T {
	if rows == nil {
		return []T{}
	}
	return rows
}
