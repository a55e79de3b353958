package v1_test

import (
	"context"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/manifests"
	"kvnet.io/kvnet/internal/testenv"
)

var c client.Client // typed and unstructured, with kvnet's scheme

func TestMain(m *testing.M) {
	os.Exit(testenv.MainAPI(m, testenv.Options{NoControllerManager: true}, func(env *testenv.Env) error {
		c = env.Client
		return nil
	}))
}

// manifest has typed network fields and, around them, fields kvnet does
// not type (CPU, memory, disks, volumes, most of the VMI status, most of
// the KubeVirt configuration).
const manifest = `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: vm, namespace: roundtrip}
spec:
  runStrategy: Always
  template:
    metadata:
      labels: {kubevirt.io/vm: vm}
    spec:
      terminationGracePeriodSeconds: 0
      domain:
        cpu: {cores: 2, model: host-passthrough}
        memory: {guest: 1Gi}
        devices:
          disks:
          - name: root
            disk: {bus: virtio}
          rng: {}
          interfaces:
          - name: default
            masquerade: {}
            portRanges:
            - {protocol: UDP, start: 5000, end: 5010}
            dhcpOptions:
              bootFileName: pxe.efi
              tftpServerName: tftp.example
              ntpServers: [192.0.2.1]
              privateOptions:
              - {option: 240, value: private.example}
          - {name: old-slirp, slirp: {}}
          - {name: old-macvtap, macvtap: {}}
          - {name: old-passt, passt: {}}
          - name: vf
            sriov: {}
            ports:
            - {name: http, port: 80}
      networks:
      - {name: default, pod: {}}
      - {name: old-slirp, pod: {}}
      - {name: old-macvtap, multus: {networkName: macvtap}}
      - {name: old-passt, pod: {}}
      - name: vf
        resourceClaim: {claimName: sriov, requestName: vf}
      volumes:
      - name: root
        containerDisk: {image: quay.io/containerdisks/fedora:latest}
---
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: vmi, namespace: roundtrip}
spec:
  domain:
    cpu: {cores: 1}
    devices:
      disks:
      - name: root
        disk: {bus: virtio}
      interfaces:
      - name: default
        binding: {name: l2bridge}
  networks:
  - {name: default, pod: {}}
  volumes:
  - name: root
    containerDisk: {image: quay.io/containerdisks/fedora:latest}
status:
  phase: Running
  nodeName: node-1
  guestOSInfo: {id: fedora, version: "42"}
  conditions:
  - {type: Ready, status: "True"}
  interfaces:
  - name: default
    ipAddress: 10.0.0.5
    ipAddresses: [10.0.0.5, fd00::5]
    mac: 02:00:00:00:00:05
    podInterfaceName: ovn-udn1
    infoSource: domain, guest-agent
    linkState: up
  migrationState:
    targetNode: node-2
    targetNodeAddress: 192.0.2.12
    targetDirectMigrationNodePorts: {"44303": 49152}
    migrationNetworkType: Migration
    mode: PreCopy
    targetState:
      nodeAddress: 192.0.2.12
      domainDetected: true
      syncAddress: 192.0.2.12:9185
---
apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata: {name: kubevirt, namespace: roundtrip}
spec:
  imagePullPolicy: IfNotPresent
  configuration:
    developerConfiguration:
      featureGates: [PortRangesSpec, NetworkDevicesWithDRA]
    network:
      binding:
        l2bridge:
          domainAttachmentType: managedTap
          migration: {}
          computeResourceOverhead:
            requests: {memory: 500Mi}
    migrations:
      network: migration-net
      bandwidthPerMigration: 64Mi
`

// change is a typed change of a network field, and the same change made to
// the unstructured object.
type change struct {
	status bool // through the status subresource
	typed  func(client.Object)
	path   []string
	value  any
}

// TestTypedRoundTrip creates a VM, a VMI and the KubeVirt CR from YAML,
// checks the typed network fields decoded, then changes a network field
// with a typed update and checks that the API server holds exactly the
// object read before, with that change: nothing kvnet does not type is
// dropped.
func TestTypedRoundTrip(t *testing.T) {
	ctx := context.Background()
	testenv.Create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "roundtrip"}})
	objs, err := manifests.Decode([]byte(manifest))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		typed   client.Object
		check   func(*testing.T, client.Object)
		changes []change
	}{{
		typed: &kubevirtv1.VirtualMachine{},
		check: checkVM,
		changes: []change{{
			typed: func(o client.Object) {
				o.(*kubevirtv1.VirtualMachine).Spec.Template.Spec.Domain.Devices.AutoattachPodInterface = new(false)
			},
			path:  []string{"spec", "template", "spec", "domain", "devices", "autoattachPodInterface"},
			value: false,
		}},
	}, {
		typed: &kubevirtv1.VirtualMachineInstance{},
		check: checkVMI,
		changes: []change{{
			typed: func(o client.Object) {
				o.(*kubevirtv1.VirtualMachineInstance).Spec.Hostname = "guest"
			},
			path:  []string{"spec", "hostname"},
			value: "guest",
		}, {
			status: true,
			typed: func(o client.Object) {
				o.(*kubevirtv1.VirtualMachineInstance).Status.MigrationState.TargetState.NodeAddress = new("192.0.2.13")
			},
			path:  []string{"status", "migrationState", "targetState", "nodeAddress"},
			value: "192.0.2.13",
		}},
	}, {
		typed: &kubevirtv1.KubeVirt{},
		check: checkKubeVirt,
		changes: []change{{
			typed: func(o client.Object) {
				o.(*kubevirtv1.KubeVirt).Spec.Configuration.NetworkConfiguration.NetworkInterface = "masquerade"
			},
			path:  []string{"spec", "configuration", "network", "defaultNetworkInterface"},
			value: "masquerade",
		}},
	}} {
		u := find(t, objs, tc.typed)
		t.Run(u.GetKind(), func(t *testing.T) {
			create(t, u)
			key := client.ObjectKeyFromObject(u)
			if err := c.Get(ctx, key, tc.typed); err != nil {
				t.Fatal(err)
			}
			tc.check(t, tc.typed)
			for _, ch := range tc.changes {
				before := getUnstructured(t, u)
				if err := c.Get(ctx, key, tc.typed); err != nil {
					t.Fatal(err)
				}
				ch.typed(tc.typed)
				if ch.status {
					err = c.Status().Update(ctx, tc.typed)
				} else {
					err = c.Update(ctx, tc.typed)
				}
				if err != nil {
					t.Fatalf("typed update of %s: %v", strings.Join(ch.path, "."), err)
				}
				want := before.DeepCopy()
				if err := unstructured.SetNestedField(want.Object, ch.value, ch.path...); err != nil {
					t.Fatal(err)
				}
				got := getUnstructured(t, u)
				for _, part := range []string{"spec", "status"} {
					if !equality.Semantic.DeepEqual(got.Object[part], want.Object[part]) {
						t.Errorf("after the typed update of %s, %s is\n%s\nwant\n%s", strings.Join(ch.path, "."), part,
							toJSON(got.Object[part]), toJSON(want.Object[part]))
					}
				}
			}
		})
	}
}

func checkVM(t *testing.T, o client.Object) {
	vm := o.(*kubevirtv1.VirtualMachine)
	spec := vm.Spec.Template.Spec
	ifaces := spec.Domain.Devices.Interfaces
	if len(ifaces) != 5 || len(spec.Networks) != 5 {
		t.Fatalf("interfaces %+v, networks %+v", ifaces, spec.Networks)
	}
	want := kubevirtv1.Interface{
		Name:       "default",
		Masquerade: &kubevirtv1.InterfaceMasquerade{},
		PortRanges: []kubevirtv1.PortRange{{Protocol: "UDP", Start: 5000, End: 5010}},
		DHCPOptions: &kubevirtv1.DHCPOptions{
			BootFileName: "pxe.efi", TFTPServerName: "tftp.example", NTPServers: []string{"192.0.2.1"},
			PrivateOptions: []kubevirtv1.DHCPPrivateOptions{{Option: 240, Value: "private.example"}},
		},
	}
	if !equality.Semantic.DeepEqual(ifaces[0], want) {
		t.Errorf("interface %+v, want %+v", ifaces[0], want)
	}
	if ifaces[1].DeprecatedSlirp == nil || ifaces[2].DeprecatedMacvtap == nil || ifaces[3].DeprecatedPasst == nil {
		t.Errorf("deprecated bindings not decoded: %+v", ifaces[1:4])
	}
	if ifaces[4].SRIOV == nil || len(ifaces[4].Ports) != 1 || ifaces[4].Ports[0].Port != 80 {
		t.Errorf("interface %+v", ifaces[4])
	}
	if rc := spec.Networks[4].ResourceClaim; rc == nil || *rc.ClaimName != "sriov" || *rc.RequestName != "vf" {
		t.Errorf("network %+v: resourceClaim not decoded", spec.Networks[4])
	}
	if m := spec.Networks[2].Multus; m == nil || m.NetworkName != "macvtap" {
		t.Errorf("network %+v", spec.Networks[2])
	}
	// What kvnet does not type is kept aside, not lost.
	if want := `{"cpu":{"cores":2,"model":"host-passthrough"},"memory":{"guest":"1Gi"}}`; spec.Domain.Unknown != kubevirtv1.UnknownFields(want) {
		t.Errorf("domain keeps %s, want %s", spec.Domain.Unknown, want)
	}
}

func checkVMI(t *testing.T, o client.Object) {
	vmi := o.(*kubevirtv1.VirtualMachineInstance)
	if b := vmi.Spec.Domain.Devices.Interfaces; len(b) != 1 || b[0].Binding == nil || b[0].Binding.Name != "l2bridge" {
		t.Errorf("interfaces %+v", b)
	}
	want := []kubevirtv1.VirtualMachineInstanceNetworkInterface{{
		Name: "default", IP: "10.0.0.5", IPs: []string{"10.0.0.5", "fd00::5"}, MAC: "02:00:00:00:00:05",
		PodInterfaceName: "ovn-udn1", InfoSource: "domain, guest-agent", LinkState: "up",
	}}
	if !equality.Semantic.DeepEqual(vmi.Status.Interfaces, want) {
		t.Errorf("status.interfaces %+v, want %+v", vmi.Status.Interfaces, want)
	}
	ms := vmi.Status.MigrationState
	if ms == nil || ms.TargetNodeAddress != "192.0.2.12" || ms.MigrationNetworkType != "Migration" ||
		ms.TargetDirectMigrationNodePorts["44303"] != 49152 || ms.TargetState == nil ||
		ms.TargetState.NodeAddress == nil || *ms.TargetState.NodeAddress != "192.0.2.12" {
		t.Errorf("status.migrationState %+v", ms)
	}
}

func checkKubeVirt(t *testing.T, o client.Object) {
	kv := o.(*kubevirtv1.KubeVirt)
	nc := kv.Spec.Configuration.NetworkConfiguration
	if nc == nil {
		t.Fatal("no network configuration")
	}
	p := nc.Binding["l2bridge"]
	if p.DomainAttachmentType != "managedTap" || p.Migration == nil || p.ComputeResourceOverhead == nil ||
		!p.ComputeResourceOverhead.Requests.Memory().Equal(resource.MustParse("500Mi")) {
		t.Errorf("binding plugin %+v", p)
	}
	if mc := kv.Spec.Configuration.MigrationConfiguration; mc == nil || mc.Network == nil || *mc.Network != "migration-net" {
		t.Errorf("migrations %+v", mc)
	}
}

// find returns the object of the typed object's kind from objs.
func find(t *testing.T, objs []*unstructured.Unstructured, typed client.Object) *unstructured.Unstructured {
	t.Helper()
	kind := reflect.TypeOf(typed).Elem().Name()
	for _, o := range objs {
		if o.GetKind() == kind {
			return o
		}
	}
	t.Fatalf("no %s in the manifest", kind)
	return nil
}

// create creates u, and then sets its status (which create ignores).
func create(t *testing.T, u *unstructured.Unstructured) {
	t.Helper()
	u = u.DeepCopy()
	status, hasStatus := u.Object["status"]
	testenv.Create(t, c, u)
	if hasStatus {
		u.Object["status"] = status
		if err := c.Status().Update(context.Background(), u); err != nil {
			t.Fatalf("set status of %s: %v", u.GetName(), err)
		}
	}
}

func getUnstructured(t *testing.T, like *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(like.GroupVersionKind())
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(like), u); err != nil {
		t.Fatal(err)
	}
	return u
}

func toJSON(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

// TestUnknownFieldsKept checks every type of the package that declares
// only part of an object (it has an UnknownFields) keeps an undeclared
// member through decoding and encoding: its JSON methods exist and work.
func TestUnknownFieldsKept(t *testing.T) {
	unknownType := reflect.TypeFor[kubevirtv1.UnknownFields]()
	pkg := unknownType.PkgPath()
	seen := map[reflect.Type]bool{}
	checked := 0
	var walk func(reflect.Type)
	walk = func(rt reflect.Type) {
		for rt.Kind() == reflect.Pointer || rt.Kind() == reflect.Slice || rt.Kind() == reflect.Map {
			rt = rt.Elem()
		}
		if rt.Kind() != reflect.Struct || rt.PkgPath() != pkg || seen[rt] {
			return
		}
		seen[rt] = true
		for f := range rt.Fields() {
			walk(f.Type)
		}
		if f, ok := rt.FieldByName("Unknown"); !ok || f.Type != unknownType {
			return
		}
		checked++
		const member = `"x-kvnet-test":{"a":[1,"b"]}`
		v := reflect.New(rt)
		if err := json.Unmarshal([]byte("{"+member+"}"), v.Interface()); err != nil {
			t.Errorf("%s: decode: %v", rt.Name(), err)
			return
		}
		b, err := json.Marshal(v.Elem().Interface())
		if err != nil || !strings.Contains(string(b), member) {
			t.Errorf("%s: encoded as %s (%v), want it to keep %s", rt.Name(), b, err, member)
		}
	}
	for _, root := range []any{kubevirtv1.VirtualMachine{}, kubevirtv1.VirtualMachineInstance{},
		kubevirtv1.VirtualMachineInstanceMigration{}, kubevirtv1.KubeVirt{}} {
		walk(reflect.TypeOf(root))
	}
	if checked < 10 {
		t.Errorf("checked only %d types", checked)
	}
}
