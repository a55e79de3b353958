package get_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/cli/get"
	"kvnet.io/kvnet/internal/hostsubnet"
	"kvnet.io/kvnet/internal/inventory"
	"kvnet.io/kvnet/internal/inventory/invtest"
	"kvnet.io/kvnet/internal/migration"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/golden"
)

var (
	// kubeconfig is an admin kubeconfig whose current context has no
	// namespace; it also has contexts "tenant" and "other" with those
	// namespaces. tenantConfig is the same with "tenant" current.
	kubeconfig, tenantConfig string
	// apiClient reads the API server the world was seeded into.
	apiClient client.Client
)

func TestMain(m *testing.M) {
	// Only the API server: the objects are written as the controllers and
	// KubeVirt would have, and nothing must change them.
	os.Exit(testenv.MainAPI(m, testenv.Options{NoControllerManager: true}, func(e *testenv.Env) error {
		dir, err := os.MkdirTemp("", "kvnet-get-")
		if err != nil {
			return err
		}
		cfg, err := clientcmd.Load(e.CP.Kubeconfig)
		if err != nil {
			return err
		}
		base := cfg.Contexts[cfg.CurrentContext]
		for _, ns := range []string{invtest.Tenant, invtest.Other} {
			c := base.DeepCopy()
			c.Namespace = ns
			cfg.Contexts[ns] = c
		}
		kubeconfig = filepath.Join(dir, "admin.kubeconfig")
		if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
			return err
		}
		cfg.CurrentContext = invtest.Tenant
		tenantConfig = filepath.Join(dir, "tenant.kubeconfig")
		if err := clientcmd.WriteToFile(*cfg, tenantConfig); err != nil {
			return err
		}
		apiClient = e.Client
		return invtest.Seed(context.Background(), e.Client, invtest.World())
	}))
}

// kvnetGet runs "kvnet get args..." and returns its stdout and stderr.
func kvnetGet(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := get.NewCommand()
	var out, errb bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errb)
	cmd.SetArgs(args)
	err = cmd.ExecuteContext(context.Background())
	return out.String(), errb.String(), err
}

func TestGolden(t *testing.T) {
	for _, tt := range []struct {
		file string
		args []string
	}{
		{"networks.golden", []string{"networks", "-A"}},
		{"networks-wide.golden", []string{"networks", "-A", "-o", "wide"}},
		{"networks-other.golden", []string{"networks", "-n", "other"}},
		{"networks.yaml.golden", []string{"networks", "-n", "tenant", "-l", "tier=prod", "-o", "yaml"}},
		{"ips.golden", []string{"ips", "-A"}},
		{"ips-tenant-wide.golden", []string{"ips", "-n", "tenant", "-o", "wide"}},
		{"ips-db.json.golden", []string{"ips", "-A", "-l", "app=db-1", "-o", "json"}},
		{"claims.golden", []string{"claims", "-A"}},
		{"claims-wide.golden", []string{"claims", "-n", "tenant", "-o", "wide"}},
		{"claims.json.golden", []string{"claims", "-n", "tenant", "-o", "json"}},
		{"vms.golden", []string{"vms", "-A"}},
		{"vms-wide.golden", []string{"vms", "-n", "tenant", "-o", "wide"}},
		{"vms-fedora.yaml.golden", []string{"vm", "-n", "tenant", "-l", "os=fedora", "-o", "yaml"}},
	} {
		t.Run(tt.file, func(t *testing.T) {
			out, stderr, err := kvnetGet(t, append(tt.args, "--kubeconfig", kubeconfig)...)
			if err != nil || stderr != "" {
				t.Fatalf("kvnet get %v: %v, stderr %q", tt.args, err, stderr)
			}
			golden.CheckString(t, tt.file, out)
		})
	}
}

// The namespace comes from -n, else the kubeconfig context (chosen with
// --context, or current), else "default"; the kubeconfig from
// --kubeconfig, else $KUBECONFIG.
func TestNamespaceAndKubeconfigResolution(t *testing.T) {
	want, _, err := kvnetGet(t, "claims", "-n", invtest.Tenant, "--kubeconfig", kubeconfig)
	if err != nil || !strings.Contains(want, "vm-a.default") {
		t.Fatalf("claims -n tenant: %v\n%s", err, want)
	}
	check := func(name string, wantOut, wantErr string, args ...string) {
		t.Helper()
		out, stderr, err := kvnetGet(t, args...)
		if err != nil || out != wantOut || stderr != wantErr {
			t.Errorf("%s: kvnet get %v: err %v\nstdout:\n%s\nstderr: %q, want stdout:\n%s\nstderr: %q", name, args, err, out, stderr, wantOut, wantErr)
		}
	}
	check("current context without namespace", "", "No resources found in default namespace.\n", "claims", "--kubeconfig", kubeconfig)
	check("--context", want, "", "claims", "--kubeconfig", kubeconfig, "--context", invtest.Tenant)
	check("--context, -n wins", "", "No resources found in other namespace.\n", "claims", "--kubeconfig", kubeconfig, "--context", invtest.Tenant, "-n", invtest.Other)

	t.Setenv("KUBECONFIG", tenantConfig)
	check("$KUBECONFIG", want, "", "claims")
	check("--kubeconfig wins over $KUBECONFIG", "", "No resources found in default namespace.\n", "claims", "--kubeconfig", kubeconfig)
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "absent")+string(filepath.ListSeparator)+tenantConfig)
	check("$KUBECONFIG list", want, "", "claims")
}

func TestErrors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"pods"}, `unknown resource "pods": want networks, ips, claims or vms`},
		{[]string{"ips", "-o", "name"}, `unable to match a printer suitable for the output format "name", allowed formats are: json,wide,yaml`},
		{[]string{"ips", "-l", "a in (b"}, `selector "a in (b"`},
		{[]string{"ips", "--context", "nope"}, "context was not found for specified context: nope"},
		{[]string{"ips", "--kubeconfig", "/nonexistent/kubeconfig"}, "/nonexistent/kubeconfig"},
	} {
		args := tt.args
		if !strings.Contains(strings.Join(args, " "), "--kubeconfig") {
			args = append(args, "--kubeconfig", kubeconfig)
		}
		_, _, err := kvnetGet(t, args...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("kvnet get %v: %v, want an error containing %q", tt.args, err, tt.want)
		}
	}
}

// TestListReadsEverything: inventory.List, which kvnet get and kvnet audit
// build on, fills every field of inventory.Objects from the API with what
// was seeded, Nodes (the host subnets of Layer3 pools) included; a field
// Build reads that List never fills would leave the real CLI blind to it
// while Build's tests, fed by hand, pass.
func TestListReadsEverything(t *testing.T) {
	got, err := inventory.List(context.Background(), apiClient, inventory.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := invtest.World()
	gv, wv := reflect.ValueOf(got).Elem(), reflect.ValueOf(want).Elem()
	for i := range gv.NumField() {
		name := gv.Type().Field(i).Name
		switch f := gv.Field(i); f.Kind() {
		case reflect.Slice:
			// The API holds more than the world: the control plane's own
			// namespaces (kvnet-system's is the world's).
			n, w := f.Len(), wv.Field(i).Len()
			if w == 0 {
				t.Errorf("invtest.World has no %s: it must exercise every field", name)
			}
			if n < w || (name != "Namespaces" && n != w) {
				t.Errorf("List read %d %s, want %d", n, name, w)
			}
		case reflect.Pointer:
			if f.IsNil() {
				t.Errorf("List left %s nil", name)
			}
		default:
			t.Errorf("field %s of kind %s: teach this test about it", name, f.Kind())
		}
	}
	if len(got.Nodes) == 3 && got.Nodes[0].Annotations[hostsubnet.Annotation] == "" {
		t.Errorf("node %s read without its %s annotation", got.Nodes[0].Name, hostsubnet.Annotation)
	}
}

// TestLayer3PoolThroughTheCLI: kvnet get networks shows a Layer3 network's
// pool as the sum of its nodes' host subnets, read from the Nodes.
func TestLayer3PoolThroughTheCLI(t *testing.T) {
	out, stderr, err := kvnetGet(t, "networks", "-n", invtest.L3, "-o", "json", "--kubeconfig", kubeconfig)
	if err != nil || stderr != "" {
		t.Fatalf("kvnet get networks: %v, stderr %q", err, stderr)
	}
	var rows []inventory.NetworkRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(rows) != 1 || rows[0].Pool == nil || *rows[0].Pool != (inventory.PoolUse{Used: 2, Size: 3 * 252}) {
		t.Errorf("Layer3 network rows %s, want one with pool 2/756", out)
	}
}

// kvnet get vms shows how each interface's network last switched nodes in
// a live migration, from kvnet-node's events on the VMI: the newest per
// network; an API switch-over as such.
func TestVMSwitchovers(t *testing.T) {
	ctx := context.Background()
	event := func(name, reason, note string, at time.Time) *corev1.Event {
		return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: invtest.Tenant, Name: name},
			InvolvedObject: corev1.ObjectReference{Kind: "VirtualMachineInstance", APIVersion: "kubevirt.io/v1", Namespace: invtest.Tenant, Name: "vm-a"},
			Reason:         reason, Message: note, Type: corev1.EventTypeNormal, Source: corev1.EventSource{Component: "kvnet-node"},
			FirstTimestamp: metav1.Time{Time: at}, LastTimestamp: metav1.Time{Time: at}}
	}
	now := time.Now().Truncate(time.Second)
	for _, e := range []*corev1.Event{
		event("vm-a.old", migration.EventSwitchedByAPI, "network tenant_primary switched from node node-1 to node node-2 by the API", now.Add(-time.Hour)),
		event("vm-a.new", migration.EventSwitchover, "network tenant_primary switched from node node-2 to node node-1 at the guest's first frame there (RARP)", now),
		event("vm-a.blue", migration.EventSwitchedByAPI, "network cluster_udn_shared switched from node node-2 to node node-1 by the API", now),
	} {
		if err := apiClient.Create(ctx, e); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = apiClient.Delete(ctx, e) })
	}
	out, stderr, err := kvnetGet(t, "vms", "-n", invtest.Tenant, "-o", "wide", "--kubeconfig", kubeconfig)
	if err != nil || stderr != "" {
		t.Fatalf("kvnet get vms: %v, stderr %q", err, stderr)
	}
	golden.CheckString(t, "vms-switchover-wide.golden", out)
	out, _, err = kvnetGet(t, "vms", "-n", invtest.Tenant, "-o", "json", "--kubeconfig", kubeconfig)
	if err != nil || !strings.Contains(out, `"switchoverNote": "network tenant_primary switched from node node-2 to node node-1 at the guest's first frame there (RARP)"`) {
		t.Fatalf("kvnet get vms -o json: %v\n%s", err, out)
	}
}
