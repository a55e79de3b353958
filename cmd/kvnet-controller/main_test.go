package main

import (
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"kvnet.io/kvnet/internal/k8s/manager"
)

func parse(t *testing.T, podNamespace string, args ...string) (manager.Options, error) {
	t.Helper()
	fs := flag.NewFlagSet("kvnet-controller", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	options := bindFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return options(podNamespace)
}

// TestFlagDefaultsAreTheLibrarys: without flags, the binary runs with
// manager.DefaultOptions, field for field (the defaults are kept in one
// place), and those options pass manager's validation.
func TestFlagDefaultsAreTheLibrarys(t *testing.T) {
	got, err := parse(t, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := manager.DefaultOptions(); !reflect.DeepEqual(got, want) {
		t.Errorf("flag defaults %+v (webhook %+v),\nwant manager.DefaultOptions %+v (webhook %+v)", got, *got.Webhook, want, *want.Webhook)
	}
	if err := got.Webhook.Validate(); err != nil {
		t.Errorf("default webhook options invalid: %v", err)
	}
	fs := flag.NewFlagSet("kvnet-controller", flag.ContinueOnError)
	bindFlags(fs)
	d := manager.DefaultOptions()
	for name, want := range map[string]string{
		"primary-network-attachment": d.Webhook.PrimaryAttachment, "default-network-nad": d.Webhook.DefaultNetworkNAD,
		"metrics-bind-address": d.MetricsAddr, "health-probe-bind-address": d.ProbeAddr, "pprof-bind-address": d.PprofAddr,
	} {
		if f := fs.Lookup(name); f == nil || f.DefValue != want {
			t.Errorf("--%s shows default %v, want %q", name, f, want)
		}
	}
}

func TestFlags(t *testing.T) {
	o, err := parse(t, "tenant-ops", "--primary-network-attachment=default-network", "--default-network-nad=ovn-kubernetes/default")
	if err != nil || o.Webhook.PrimaryAttachment != manager.PrimaryByDefaultNetwork || o.Webhook.DefaultNetworkNAD != "ovn-kubernetes/default" ||
		o.Webhook.Namespace != "tenant-ops" {
		t.Errorf("default-network mode: %+v, %v", o.Webhook, err)
	}
	if o, err := parse(t, "", "--enable-dynamic-host-subnets", "--host-subnet-grace=30s"); err != nil || !o.DynamicHostSubnets || o.HostSubnetGrace != 30*time.Second {
		t.Errorf("dynamic host subnets: %v, grace %s, %v", o.DynamicHostSubnets, o.HostSubnetGrace, err)
	}
	if o, err := parse(t, "", "--pprof-bind-address=127.0.0.1:6060"); err != nil || o.PprofAddr != "127.0.0.1:6060" {
		t.Errorf("--pprof-bind-address: %q, %v", o.PprofAddr, err)
	}
	if o, err := parse(t, "tenant-ops", "--restart-reserve=16"); err != nil || o.RestartReserve != 16 || o.Namespace != "tenant-ops" {
		t.Errorf("--restart-reserve=16 in tenant-ops: %d in %q, %v", o.RestartReserve, o.Namespace, err)
	}
	if o, err := parse(t, "", "--webhook-port=0"); err != nil || o.Webhook != nil {
		t.Errorf("--webhook-port=0: webhook %+v, %v; want none", o.Webhook, err)
	}
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"--primary-network-attachment=default-network"}, "default network NAD is required with primary network attachment default-network"},
		{[]string{"--primary-network-attachment=default-network", "--default-network-nad=default"}, `default network NAD "default": want <namespace>/<name>`},
		{[]string{"--primary-network-attachment=default-network", "--default-network-nad=/default"}, `default network NAD "/default"`},
		{[]string{"--primary-network-attachment=default-network", "--default-network-nad=a/b/c"}, `default network NAD "a/b/c"`},
		{[]string{"--primary-network-attachment="}, `primary network attachment "": want "multus", "multus-default" or "default-network"`},
		{[]string{"--primary-network-attachment=bogus"}, `primary network attachment "bogus"`},
		{[]string{"--webhook-port=70000"}, "webhook port 70000"},
		{[]string{"--host-subnet-grace=0s"}, "--host-subnet-grace 0s: must be positive"},
		{[]string{"--host-subnet-grace=-1m"}, "--host-subnet-grace -1m0s: must be positive"},
		{[]string{"--restart-reserve=-1"}, "--restart-reserve -1: must be from 0 to 1024"},
		{[]string{"--restart-reserve=1025"}, "--restart-reserve 1025: must be from 0 to 1024"},
	} {
		_, err := parse(t, "", tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%v: error %v, want it to contain %q", tc.args, err, tc.err)
		}
	}
}
