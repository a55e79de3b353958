package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	labcluster "kvnet.io/kvnet/internal/lab/cluster"
)

type demoFlags struct {
	dir     string
	kvnet   string
	timeout time.Duration
	cleanup bool
	only    string
}

// newDemoCommand returns "kvnet-lab cluster demo".
func newDemoCommand() *cobra.Command {
	f := &demoFlags{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the pod scenarios (and the VM scenarios with KubeVirt) on the running cluster (installs kvnet first when it is not there)",
		Long: "Against the cluster of `kvnet-lab cluster up --dir <dir>` (its kubeconfig and env): installs kvnet\n" +
			"with `kvnet install` from the cluster's registry unless it is installed, waits for it and runs\n" +
			"`kvnet check`; then removes a previous run's objects, creates the scenarios' namespaces (scn-*),\n" +
			"networks and pods, and prints one line per scenario: PASS or FAIL, its name, what was seen.\n" +
			"On a cluster with KubeVirt (GUEST_IMAGE in its env) the VM scenarios follow (namespaces scn-vm*):\n" +
			"BLOCKED marks one this machine cannot run (a kernel feature it lacks), and does not fail the demo.\n" +
			"The objects stay to explore (KUBECONFIG=<dir>/kubeconfig kubectl get pods -A). Exits 1 if any\n" +
			"scenario failed. --cleanup deletes the scenarios' objects instead.",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
			defer cancel()
			return runDemo(ctx, f, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&f.dir, "dir", ".cluster", "the cluster's directory (kubeconfig, env)")
	cmd.Flags().StringVar(&f.kvnet, "kvnet", "", "the kvnet binary (default: kvnet next to kvnet-lab, as make build puts it in bin/)")
	cmd.Flags().BoolVar(&f.cleanup, "cleanup", false, "delete the scenarios' namespaces and network (what a run left), run nothing")
	cmd.Flags().StringVar(&f.only, "only", "", `run only the "pods" or the "vms" scenarios (default: both; the VM scenarios need KubeVirt)`)
	cmd.Flags().DurationVar(&f.timeout, "timeout", 20*time.Minute, "how long the whole demo may take")
	return cmd
}

// errScenariosFailed is the demo's error when a scenario failed (each is
// printed).
var errScenariosFailed = errors.New("scenarios failed")

func runDemo(ctx context.Context, f *demoFlags, out io.Writer) error {
	if f.only != "" && f.only != "pods" && f.only != "vms" {
		return fmt.Errorf(`--only %q: want "pods" or "vms"`, f.only)
	}
	target, err := labcluster.ScenarioTargetFromDir(f.dir)
	if err != nil {
		return fmt.Errorf("cluster in %s (make cluster-up): %w", f.dir, err)
	}
	if f.cleanup {
		if err := labcluster.CleanupPodScenarios(ctx, target, out); err != nil {
			return err
		}
		if err := labcluster.CleanupVMScenarios(ctx, target, out); err != nil {
			return err
		}
		fmt.Fprintln(out, "demo: the scenarios' objects are gone")
		return nil
	}
	env, err := labcluster.ReadEnv(f.dir)
	if err != nil {
		return err
	}
	kubeconfig := filepath.Join(f.dir, labcluster.KubeconfigFile)
	kvnetBin := f.kvnet
	if kvnetBin == "" {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		kvnetBin = filepath.Join(filepath.Dir(self), "kvnet")
	}
	kvnet := func(args ...string) error {
		args = append(args, "--kubeconfig", kubeconfig)
		fmt.Fprintf(out, "$ %s %s\n", kvnetBin, strings.Join(args, " "))
		cmd := exec.CommandContext(ctx, kvnetBin, args...)
		cmd.Stdout, cmd.Stderr = out, out
		return cmd.Run()
	}

	installed, err := labcluster.KvnetInstalled(ctx, target.Client)
	if err != nil {
		return err
	}
	if installed {
		fmt.Fprintln(out, "demo: kvnet is installed")
	} else {
		if env["KVNET_REGISTRY"] == "" || env["KVNET_TAG"] == "" {
			return fmt.Errorf("kvnet is not installed and the cluster in %s has no kvnet images (KVNET_REGISTRY, KVNET_TAG in its env): start it with --kvnet-images", f.dir)
		}
		if err := kvnet("install", "--registry", env["KVNET_REGISTRY"], "--tag", env["KVNET_TAG"]); err != nil {
			return fmt.Errorf("kvnet install: %w", err)
		}
	}
	fmt.Fprintln(out, "demo: waiting for kvnet-controller and kvnet-node")
	if err := labcluster.WaitKvnetReady(ctx, target.Client, 5*time.Minute); err != nil {
		return fmt.Errorf("kvnet not ready: %w", err)
	}
	if err := kvnet("check"); err != nil {
		return fmt.Errorf("kvnet check: %w", err)
	}

	var results []labcluster.ScenarioResult
	if f.only != "vms" {
		if results, err = labcluster.RunPodScenarios(ctx, target, out); err != nil {
			return err
		}
	}
	if f.only == "vms" && target.GuestImage == "" {
		return fmt.Errorf("--only vms: the cluster in %s has no KubeVirt (no GUEST_IMAGE in its env): start it with --kubevirt", f.dir)
	}
	if f.only != "pods" && target.GuestImage != "" {
		vms, err := labcluster.RunVMScenarios(ctx, target, out)
		if err != nil {
			return err
		}
		results = append(results, vms...)
	}
	failed, blocked := 0, 0
	for _, r := range results {
		switch {
		case r.Blocked:
			blocked++
		case !r.OK:
			failed++
		}
	}
	fmt.Fprintf(out, "demo: %d of %d scenarios passed, %d blocked on this machine; the objects stay (namespaces labelled %s or %s)\n",
		len(results)-failed-blocked, len(results), blocked, labcluster.ScenarioLabel, labcluster.VMScenarioLabel)
	if failed > 0 {
		return fmt.Errorf("%w: %d of %d", errScenariosFailed, failed, len(results))
	}
	return nil
}
