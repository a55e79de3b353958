package v1_test

// These tests apply UserDefinedNetwork and ClusterUserDefinedNetwork
// manifests to a real kube-apiserver serving the CRDs kvnet ships, and assert
// that each is accepted or rejected with OVN-Kubernetes' exact CEL message
// (matched against the whole message of one of the API server's causes), and
// that every CEL rule of the CRDs has a case.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kvnet.io/kvnet/internal/testenv"
)

var env *testenv.Env

const ns = "api-validation"

func TestMain(m *testing.M) {
	os.Exit(testenv.MainAPI(m, testenv.Options{NoControllerManager: true}, func(e *testenv.Env) error {
		env = e
		return env.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}))
}

// udn wraps a spec in a UserDefinedNetwork manifest.
func udn(spec string) string {
	return "apiVersion: k8s.ovn.org/v1\nkind: UserDefinedNetwork\nmetadata: {name: NAME, namespace: " + ns + "}\nspec:\n" + indent(spec, "  ")
}

// cudn wraps a spec in a ClusterUserDefinedNetwork manifest.
func cudn(spec string) string {
	return "apiVersion: k8s.ovn.org/v1\nkind: ClusterUserDefinedNetwork\nmetadata: {name: NAME}\nspec:\n" + indent(spec, "  ")
}

// cudnNet wraps a network spec in a CUDN selecting one namespace.
func cudnNet(network string) string {
	return cudn("namespaceSelector: {matchLabels: {team: a}}\nnetwork:\n" + indent(network, "  "))
}

func indent(s, by string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = by + l
	}
	return strings.Join(lines, "\n") + "\n"
}

type createCase struct {
	name    string
	yaml    string
	wantErr string // "" means accepted
}

var createCases = []createCase{
	// Accepted, as written in the OpenShift Virtualization docs and beyond.
	{"l2 primary persistent (docs)", udn("topology: Layer2\nlayer2:\n  role: Primary\n  subnets: [10.100.0.0/16]\n  ipam: {lifecycle: Persistent}"), ""},
	{"l2 secondary", udn("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.200.0.0/24]}"), ""},
	{"l2 secondary ipam disabled", udn("topology: Layer2\nlayer2: {role: Secondary, ipam: {mode: Disabled}}"), ""},
	{"l2 primary dual stack", udn("topology: Layer2\nlayer2: {role: Primary, mtu: 1400, subnets: [10.0.0.0/24, 'fd00::/64']}"), ""},
	{"l2 primary join subnets", udn("topology: Layer2\nlayer2: {role: Primary, subnets: [10.0.0.0/24], joinSubnets: [100.66.0.0/16]}"), ""},
	{"l2 primary reserved subnets", udn("topology: Layer2\nlayer2: {role: Primary, subnets: [10.0.0.0/24], reservedSubnets: [10.0.0.128/26]}"), ""},
	{"l2 primary infra and gateway", udn("topology: Layer2\nlayer2: {role: Primary, subnets: [10.0.0.0/24], infrastructureSubnets: [10.0.0.0/30], defaultGatewayIPs: [10.0.0.1]}"), ""},
	{"l2 primary gateway in subnet", udn("topology: Layer2\nlayer2: {role: Primary, subnets: [10.0.0.0/24], defaultGatewayIPs: [10.0.0.254]}"), ""},
	{"l3 primary host subnet", udn("topology: Layer3\nlayer3: {role: Primary, subnets: [{cidr: 10.100.0.0/16, hostSubnet: 24}]}"), ""},
	{"l3 secondary dual stack", udn("topology: Layer3\nlayer3: {role: Secondary, subnets: [{cidr: 10.100.0.0/16}, {cidr: 'fd00::/48', hostSubnet: 64}]}"), ""},
	{"l3 primary join subnets", udn("topology: Layer3\nlayer3: {role: Primary, subnets: [{cidr: 10.100.0.0/16}], joinSubnets: [100.66.0.0/16]}"), ""},
	{"l2 secondary ipv6 mtu 1280", udn("topology: Layer2\nlayer2: {role: Secondary, mtu: 1280, subnets: ['fd00::/64']}"), ""},
	{"l2 secondary persistent", udn("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.0.0.0/24], ipam: {mode: Enabled, lifecycle: Persistent}}"), ""},
	{"cudn l2 primary", cudnNet("topology: Layer2\nlayer2: {role: Primary, subnets: [10.0.0.0/24], ipam: {lifecycle: Persistent}}"), ""},
	{"cudn l3 secondary", cudnNet("topology: Layer3\nlayer3: {role: Secondary, subnets: [{cidr: 10.100.0.0/16, hostSubnet: 24}]}"), ""},
	{"cudn localnet vlan", cudnNet("topology: Localnet\nlocalnet: {role: Secondary, physicalNetworkName: physnet, subnets: [192.168.0.0/24], excludeSubnets: [192.168.0.200/30], vlan: {mode: Access, access: {id: 200}}}"), ""},
	{"cudn localnet ipam disabled", cudnNet("topology: Localnet\nlocalnet: {role: Secondary, physicalNetworkName: physnet, ipam: {mode: Disabled}}"), ""},
	{"cudn localnet persistent", cudnNet("topology: Localnet\nlocalnet: {role: Secondary, physicalNetworkName: physnet, subnets: [192.168.0.0/24], ipam: {lifecycle: Persistent}}"), ""},
	{"cudn localnet ipv6 mtu", cudnNet("topology: Localnet\nlocalnet: {role: Secondary, physicalNetworkName: physnet, mtu: 1500, subnets: ['fd00::/64']}"), ""},
	{"cudn selector expressions", cudn("namespaceSelector: {matchExpressions: [{key: kubernetes.io/metadata.name, operator: In, values: [a, b]}]}\nnetwork:\n  topology: Layer2\n  layer2: {role: Secondary, subnets: [10.0.0.0/24]}"), ""},

	// UDN topology union.
	{"layer2 missing", udn("topology: Layer2"), "spec.layer2 is required when topology is Layer2 and forbidden otherwise"},
	{"layer3 missing", udn("topology: Layer3"), "spec.layer3 is required when topology is Layer3 and forbidden otherwise"},
	{"layer3 with layer2 topology", udn("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.0.0.0/24]}\nlayer3: {role: Secondary, subnets: [{cidr: 10.1.0.0/16}]}"), "spec.layer3 is required when topology is Layer3 and forbidden otherwise"},
	{"layer2 with layer3 topology", udn("topology: Layer3\nlayer3: {role: Secondary, subnets: [{cidr: 10.1.0.0/16}]}\nlayer2: {role: Secondary, subnets: [10.0.0.0/24]}"), "spec.layer2 is required when topology is Layer2 and forbidden otherwise"},
	{"udn localnet topology", udn("topology: Localnet"), `Unsupported value: "Localnet"`},
	{"topology missing", udn("layer2: {role: Secondary, subnets: [10.0.0.0/24]}"), "spec.topology: Required value"},

	// Layer2.
	{"l2 subnets missing", udn("topology: Layer2\nlayer2: {role: Secondary}"), "Subnets is required with ipam.mode is Enabled or unset"},
	{"l2 subnets missing ipam enabled", udn("topology: Layer2\nlayer2: {role: Secondary, ipam: {mode: Enabled}}"), "Subnets is required with ipam.mode is Enabled or unset"},
	{"l2 subnets with ipam disabled", udn("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.0.0.0/24], ipam: {mode: Disabled}}"), "Subnets must be unset when ipam.mode is Disabled"},
	{"l2 primary ipam disabled", udn("topology: Layer2\nlayer2: {role: Primary, ipam: {mode: Disabled}}"), "Disabled ipam.mode is only supported for Secondary network"},
	{"l2 secondary join subnets", udn("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.0.0.0/24], joinSubnets: [100.66.0.0/16]}"), "JoinSubnets is only supported for Primary network"},
	{"l2 ipv6 small mtu", udn("topology: Layer2\nlayer2: {role: Secondary, mtu: 1000, subnets: ['fd00::/64']}"), "MTU should be greater than or equal to 1280 when IPv6 subnet is used"},
	{"l2 secondary gateway", udn("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.0.0.0/24], defaultGatewayIPs: [10.0.0.1]}"), "defaultGatewayIPs is only supported for Primary network"},
	{"l2 gateway outside subnets", udn("topology: Layer2\nlayer2: {role: Primary, subnets: [10.0.0.0/24], defaultGatewayIPs: [10.9.0.1]}"), "defaultGatewayIPs must belong to one of the subnets specified in the subnets field"},
	{"l2 gateway one family of two", udn("topology: Layer2\nlayer2: {role: Primary, subnets: [10.0.0.0/24, 'fd00::/64'], defaultGatewayIPs: [10.0.0.1]}"), "defaultGatewayIPs must be specified for all IP families"},
	{"l2 secondary reserved", udn("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.0.0.0/24], reservedSubnets: [10.0.0.0/28]}"), "reservedSubnets is only supported for Primary network"},
	{"l2 reserved outside", udn("topology: Layer2\nlayer2: {role: Primary, subnets: [10.0.0.0/24], reservedSubnets: [10.1.0.0/28]}"), "reservedSubnets must be subnetworks of the networks specified in the subnets field"},
	{"l2 reserved without subnets", udn("topology: Layer2\nlayer2: {role: Secondary, ipam: {mode: Disabled}, reservedSubnets: [10.1.0.0/28]}"), "reservedSubnets must be unset when subnets is unset"},
	{"l2 secondary infra", udn("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.0.0.0/24], infrastructureSubnets: [10.0.0.0/30]}"), "infrastructureSubnets is only supported for Primary network"},
	{"l2 infra outside", udn("topology: Layer2\nlayer2: {role: Primary, subnets: [10.0.0.0/24], infrastructureSubnets: [10.5.0.0/30]}"), "infrastructureSubnets must be subnetworks of the networks specified in the subnets field"},
	{"l2 infra without subnets", udn("topology: Layer2\nlayer2: {role: Secondary, ipam: {mode: Disabled}, infrastructureSubnets: [10.5.0.0/30]}"), "infrastructureSubnets must be unset when subnets is unset"},
	{"l2 infra overlaps reserved", udn("topology: Layer2\nlayer2: {role: Primary, subnets: [10.0.0.0/24], infrastructureSubnets: [10.0.0.0/28], reservedSubnets: [10.0.0.0/29]}"), "infrastructureSubnets and reservedSubnets must not overlap"},
	{"l2 infra host bits", udn("topology: Layer2\nlayer2: {role: Primary, subnets: [10.0.0.0/24], infrastructureSubnets: [10.0.0.1/30]}"), "infrastructureSubnets must be a masked network address (no host bits set)"},
	{"l2 reserved host bits", udn("topology: Layer2\nlayer2: {role: Primary, subnets: [10.0.0.0/24], reservedSubnets: [10.0.0.5/29]}"), "reservedSubnets must be a masked network address (no host bits set)"},
	{"l2 gateway outside infra", udn("topology: Layer2\nlayer2: {role: Primary, subnets: [10.0.0.0/24], infrastructureSubnets: [10.0.0.0/30], defaultGatewayIPs: [10.0.0.100]}"), "defaultGatewayIPs have to belong to infrastructureSubnets"},
	{"l2 persistent with ipam disabled", udn("topology: Layer2\nlayer2: {role: Secondary, ipam: {mode: Disabled, lifecycle: Persistent}}"), "lifecycle Persistent is only supported when ipam.mode is Enabled"},
	{"l2 empty ipam", udn("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.0.0.0/24], ipam: {}}"), "should have at least 1 properties"},
	{"l2 bad lifecycle", udn("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.0.0.0/24], ipam: {lifecycle: Forever}}"), `Unsupported value: "Forever"`},
	{"l2 bad ipam mode", udn("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.0.0.0/24], ipam: {mode: Sometimes}}"), `Unsupported value: "Sometimes"`},
	{"l2 invalid cidr", udn("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.0.0.0/33]}"), "CIDR is invalid"},
	{"l2 cidr not an address", udn("topology: Layer2\nlayer2: {role: Secondary, subnets: [tenant-a]}"), "CIDR is invalid"},
	{"l2 two v4 subnets", udn("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.0.0.0/24, 10.1.0.0/24]}"), "When 2 CIDRs are set, they must be from different IP families"},
	{"l2 three subnets", udn("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.0.0.0/24, 'fd00::/64', 10.1.0.0/24]}"), "must have at most 2 items"},
	{"l2 role missing", udn("topology: Layer2\nlayer2: {subnets: [10.0.0.0/24]}"), "spec.layer2.role: Required value"},
	{"l2 bad role", udn("topology: Layer2\nlayer2: {role: Tertiary, subnets: [10.0.0.0/24]}"), `Unsupported value: "Tertiary"`},
	{"l2 mtu too small", udn("topology: Layer2\nlayer2: {role: Secondary, mtu: 500, subnets: [10.0.0.0/24]}"), "should be greater than or equal to 576"},
	{"l2 mtu too large", udn("topology: Layer2\nlayer2: {role: Secondary, mtu: 70000, subnets: [10.0.0.0/24]}"), "should be less than or equal to 65536"},
	{"l2 invalid gateway ip", udn("topology: Layer2\nlayer2: {role: Primary, subnets: [10.0.0.0/24], defaultGatewayIPs: [10.0.0.300]}"), "IP is invalid"},
	{"l2 two v4 gateways", udn("topology: Layer2\nlayer2: {role: Primary, subnets: [10.0.0.0/24, 'fd00::/64'], defaultGatewayIPs: [10.0.0.1, 10.0.0.2]}"), "When 2 IPs are set, they must be from different IP families"},
	{"l2 too many reserved", udn("topology: Layer2\nlayer2:\n  role: Primary\n  subnets: [10.0.0.0/16]\n  reservedSubnets: [" + manyCIDRs(26) + "]"), "must have at most 25 items"},

	// Layer3.
	{"l3 host subnet not smaller", udn("topology: Layer3\nlayer3: {role: Primary, subnets: [{cidr: 10.100.0.0/16, hostSubnet: 16}]}"), "HostSubnet must be smaller than CIDR subnet"},
	{"l3 ipv4 host subnet 32", udn("topology: Layer3\nlayer3: {role: Primary, subnets: [{cidr: 10.100.0.0/16, hostSubnet: 32}]}"), "HostSubnet must < 32 for ipv4 CIDR"},
	{"l3 secondary three subnets", udn("topology: Layer3\nlayer3: {role: Secondary, subnets: [{cidr: 10.1.0.0/16}, {cidr: 'fd00::/48'}, {cidr: 10.2.0.0/16}]}"), "Secondary networks may define at most 2 subnets"},
	{"l3 secondary same family", udn("topology: Layer3\nlayer3: {role: Secondary, subnets: [{cidr: 10.1.0.0/16}, {cidr: 10.2.0.0/16}]}"), "When 2 CIDRs are set for Secondary networks, they must be from different IP families"},
	{"l3 overlapping subnets", udn("topology: Layer3\nlayer3: {role: Primary, subnets: [{cidr: 10.0.0.0/8}, {cidr: 10.1.0.0/16}]}"), "Subnets must not overlap or contain each other"},
	{"l3 duplicate subnets", udn("topology: Layer3\nlayer3: {role: Primary, subnets: [{cidr: 10.1.0.0/16}, {cidr: 10.1.0.0/16}]}"), "Subnets with same CIDR are not allowed"},
	{"l3 mixed host subnets", udn("topology: Layer3\nlayer3: {role: Primary, subnets: [{cidr: 10.1.0.0/16, hostSubnet: 24}, {cidr: 10.2.0.0/16, hostSubnet: 25}]}"), "Subnets from the same IP family must use the same hostSubnet value"},
	{"l3 secondary join subnets", udn("topology: Layer3\nlayer3: {role: Secondary, subnets: [{cidr: 10.1.0.0/16}], joinSubnets: [100.66.0.0/16]}"), "JoinSubnets is only supported for Primary network"},
	{"l3 ipv6 small mtu", udn("topology: Layer3\nlayer3: {role: Primary, mtu: 1000, subnets: [{cidr: 'fd00::/48'}]}"), "MTU should be greater than or equal to 1280 when IPv6 subnet is used"},
	{"l3 no subnets", udn("topology: Layer3\nlayer3: {role: Primary, subnets: []}"), "should have at least 1 items"},
	{"l3 host subnet out of range", udn("topology: Layer3\nlayer3: {role: Primary, subnets: [{cidr: 'fd00::/48', hostSubnet: 128}]}"), "should be less than or equal to 127"},

	// ClusterUserDefinedNetwork.
	{"cudn selector missing", cudn("network:\n  topology: Layer2\n  layer2: {role: Secondary, subnets: [10.0.0.0/24]}"), "spec.namespaceSelector: Required value"},
	{"cudn network missing", cudn("namespaceSelector: {}"), "spec.network: Required value"},
	{"cudn localnet missing", cudnNet("topology: Localnet"), "spec.localnet is required when topology is Localnet and forbidden otherwise"},
	{"cudn localnet with layer2 topology", cudnNet("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.0.0.0/24]}\nlocalnet: {role: Secondary, physicalNetworkName: physnet, subnets: [192.168.0.0/24]}"), "spec.localnet is required when topology is Localnet and forbidden otherwise"},
	{"cudn layer2 missing", cudnNet("topology: Layer2"), "spec.layer2 is required when topology is Layer2 and forbidden otherwise"},
	{"cudn layer3 missing", cudnNet("topology: Layer3"), "spec.layer3 is required when topology is Layer3 and forbidden otherwise"},
	{"cudn l2 primary ipam disabled", cudnNet("topology: Layer2\nlayer2: {role: Primary, ipam: {mode: Disabled}}"), "Disabled ipam.mode is only supported for Secondary network"},
	{"localnet primary", cudnNet("topology: Localnet\nlocalnet: {role: Primary, physicalNetworkName: physnet, subnets: [192.168.0.0/24]}"), `Unsupported value: "Primary"`},
	{"localnet physnet colon", cudnNet("topology: Localnet\nlocalnet: {role: Secondary, physicalNetworkName: 'phys:net', subnets: [192.168.0.0/24]}"), "physicalNetworkName cannot contain `,` or `:` characters"},
	{"localnet physnet comma", cudnNet("topology: Localnet\nlocalnet: {role: Secondary, physicalNetworkName: 'a,b', subnets: [192.168.0.0/24]}"), "physicalNetworkName cannot contain `,` or `:` characters"},
	{"localnet physnet empty", cudnNet("topology: Localnet\nlocalnet: {role: Secondary, physicalNetworkName: '', subnets: [192.168.0.0/24]}"), "should be at least 1 chars long"},
	{"localnet subnets missing", cudnNet("topology: Localnet\nlocalnet: {role: Secondary, physicalNetworkName: physnet}"), "Subnets is required with ipam.mode is Enabled or unset, and forbidden otherwise"},
	{"localnet subnets with ipam disabled", cudnNet("topology: Localnet\nlocalnet: {role: Secondary, physicalNetworkName: physnet, subnets: [192.168.0.0/24], ipam: {mode: Disabled}}"), "Subnets is required with ipam.mode is Enabled or unset, and forbidden otherwise"},
	{"localnet exclude without subnets", cudnNet("topology: Localnet\nlocalnet: {role: Secondary, physicalNetworkName: physnet, ipam: {mode: Disabled}, excludeSubnets: [192.168.0.0/30]}"), "excludeSubnets must be unset when subnets is unset"},
	{"localnet ipv6 small mtu", cudnNet("topology: Localnet\nlocalnet: {role: Secondary, physicalNetworkName: physnet, mtu: 1000, subnets: ['fd00::/64']}"), "MTU should be greater than or equal to 1280 when an IPv6 subnet is used"},
	{"localnet vlan access missing", cudnNet("topology: Localnet\nlocalnet: {role: Secondary, physicalNetworkName: physnet, subnets: [192.168.0.0/24], vlan: {mode: Access}}"), "vlan access config is required when vlan mode is 'Access', and forbidden otherwise"},
	{"localnet vlan id too large", cudnNet("topology: Localnet\nlocalnet: {role: Secondary, physicalNetworkName: physnet, subnets: [192.168.0.0/24], vlan: {mode: Access, access: {id: 4095}}}"), "should be less than or equal to 4094"},
	{"localnet vlan bad mode", cudnNet("topology: Localnet\nlocalnet: {role: Secondary, physicalNetworkName: physnet, subnets: [192.168.0.0/24], vlan: {mode: Trunk}}"), `Unsupported value: "Trunk"`},
	{"localnet persistent ipam disabled", cudnNet("topology: Localnet\nlocalnet: {role: Secondary, physicalNetworkName: physnet, ipam: {mode: Disabled, lifecycle: Persistent}}"), "lifecycle Persistent is only supported when ipam.mode is Enabled"},
}

func manyCIDRs(n int) string {
	s := make([]string, n)
	for i := range s {
		s[i] = fmt.Sprintf("10.0.%d.0/24", i)
	}
	return strings.Join(s, ", ")
}

type updateCase struct {
	name           string
	create, update string
	wantErr        string
}

var updateCases = []updateCase{
	{"udn topology", udn("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.0.0.0/24]}"), udn("topology: Layer3\nlayer3: {role: Secondary, subnets: [{cidr: 10.1.0.0/16}]}"), "Topology is immutable"},
	{"udn layer2", udn("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.0.0.0/24]}"), udn("topology: Layer2\nlayer2: {role: Secondary, mtu: 1300, subnets: [10.0.0.0/24]}"), "Layer2 is immutable"},
	{"l3 role", udn("topology: Layer3\nlayer3: {role: Primary, subnets: [{cidr: 10.1.0.0/16}]}"), udn("topology: Layer3\nlayer3: {role: Secondary, subnets: [{cidr: 10.1.0.0/16}]}"), "role is immutable"},
	{"l3 mtu", udn("topology: Layer3\nlayer3: {role: Primary, mtu: 1400, subnets: [{cidr: 10.1.0.0/16}]}"), udn("topology: Layer3\nlayer3: {role: Primary, mtu: 1300, subnets: [{cidr: 10.1.0.0/16}]}"), "mtu is immutable"},
	{"l3 secondary subnets", udn("topology: Layer3\nlayer3: {role: Secondary, subnets: [{cidr: 10.1.0.0/16}]}"), udn("topology: Layer3\nlayer3: {role: Secondary, subnets: [{cidr: 10.1.0.0/16}, {cidr: 'fd00::/48'}]}"), "Subnets is immutable for Secondary role"},
	{"l3 remove subnet", udn("topology: Layer3\nlayer3: {role: Primary, subnets: [{cidr: 10.1.0.0/16}, {cidr: 10.2.0.0/16}]}"), udn("topology: Layer3\nlayer3: {role: Primary, subnets: [{cidr: 10.1.0.0/16}]}"), "Removing existing subnets is not allowed"},
	{"l3 append subnet", udn("topology: Layer3\nlayer3: {role: Primary, subnets: [{cidr: 10.1.0.0/16}]}"), udn("topology: Layer3\nlayer3: {role: Primary, subnets: [{cidr: 10.1.0.0/16}, {cidr: 10.2.0.0/16}]}"), ""},
	{"l3 host subnet", udn("topology: Layer3\nlayer3: {role: Primary, subnets: [{cidr: 10.1.0.0/16, hostSubnet: 24}]}"), udn("topology: Layer3\nlayer3: {role: Primary, subnets: [{cidr: 10.1.0.0/16, hostSubnet: 25}]}"), "hostSubnet is immutable"},
	{"l3 join subnets", udn("topology: Layer3\nlayer3: {role: Primary, subnets: [{cidr: 10.1.0.0/16}], joinSubnets: [100.66.0.0/16]}"), udn("topology: Layer3\nlayer3: {role: Primary, subnets: [{cidr: 10.1.0.0/16}], joinSubnets: [100.67.0.0/16]}"), "joinSubnets is immutable"},
	{"cudn topology", cudnNet("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.0.0.0/24]}"), cudnNet("topology: Layer3\nlayer3: {role: Secondary, subnets: [{cidr: 10.1.0.0/16}]}"), "Topology is immutable"},
	{"cudn layer2", cudnNet("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.0.0.0/24]}"), cudnNet("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.9.0.0/24]}"), "Layer2 is immutable"},
	{"cudn localnet", cudnNet("topology: Localnet\nlocalnet: {role: Secondary, physicalNetworkName: physnet, subnets: [192.168.0.0/24]}"), cudnNet("topology: Localnet\nlocalnet: {role: Secondary, physicalNetworkName: other, subnets: [192.168.0.0/24]}"), "Localnet is immutable"},
	{"cudn selector", cudnNet("topology: Layer2\nlayer2: {role: Secondary, subnets: [10.0.0.0/24]}"), cudn("namespaceSelector: {matchLabels: {team: b}}\nnetwork:\n  topology: Layer2\n  layer2: {role: Secondary, subnets: [10.0.0.0/24]}"), ""},
}

func object(t *testing.T, manifest, name string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(strings.ReplaceAll(manifest, "NAME", name)), &u.Object); err != nil {
		t.Fatalf("bad test manifest: %v\n%s", err, manifest)
	}
	return u
}

func TestCreateValidation(t *testing.T) {
	if n := len(createCases) + len(updateCases); n < 60 {
		t.Fatalf("only %d cases", n)
	}
	ctx := context.Background()
	for i, tc := range append(createCases, cudnCreateCases(t)...) {
		t.Run(tc.name, func(t *testing.T) {
			obj := object(t, tc.yaml, fmt.Sprintf("create-%d", i))
			err := env.Client.Create(ctx, obj)
			checkErr(t, err, tc.wantErr)
			if err == nil {
				if err := env.Client.Delete(ctx, obj); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestEveryCELRuleExercised fails when a CEL message of either CRD has no
// case of that kind expecting it: the UDN and CUDN CRDs carry their own
// copies of most rules, and each copy must be exercised.
func TestEveryCELRuleExercised(t *testing.T) {
	msgs, err := celMessages()
	if err != nil {
		t.Fatal(err)
	}
	expected := map[string]map[string]bool{}
	expect := func(manifest, msg string) {
		k := kindOf(manifest)
		if expected[k] == nil {
			expected[k] = map[string]bool{}
		}
		expected[k][msg] = true
	}
	for _, tc := range append(createCases, cudnCreateCases(t)...) {
		expect(tc.yaml, tc.wantErr)
	}
	for _, tc := range append(updateCases, cudnUpdateCases(t)...) {
		expect(tc.update, tc.wantErr)
	}
	var missing []string
	total := 0
	for kind, kindMsgs := range msgs {
		total += len(kindMsgs)
		for m := range kindMsgs {
			if !expected[kind][m] {
				missing = append(missing, kind+": "+m)
			}
		}
	}
	if len(missing) > 0 {
		t.Fatalf("%d of %d CEL messages have no case of their kind: %q", len(missing), total, missing)
	}
	t.Logf("all %d CEL messages (UDN %d, CUDN %d) exercised", total, len(msgs["UserDefinedNetwork"]), len(msgs["ClusterUserDefinedNetwork"]))
}

// asCUDN returns the network of a UDN manifest as a CUDN selecting one
// namespace: the CUDN CRD carries its own copy of the UDN's rules, and
// every copy is checked.
func asCUDN(manifest string) string {
	_, spec, _ := strings.Cut(manifest, "\nspec:\n")
	lines := strings.Split(strings.TrimRight(spec, "\n"), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "  ")
	}
	return cudnNet(strings.Join(lines, "\n"))
}

// cudnCreateCases and cudnUpdateCases are the UDN cases whose rule the CUDN
// CRD also has, run again as CUDNs.
func cudnCreateCases(t *testing.T) []createCase {
	var out []createCase
	for _, tc := range createCases {
		if kindOf(tc.yaml) == "UserDefinedNetwork" && isCELMessageOf(t, "ClusterUserDefinedNetwork", tc.wantErr) {
			out = append(out, createCase{name: tc.name + " (as cudn)", yaml: asCUDN(tc.yaml), wantErr: tc.wantErr})
		}
	}
	return out
}

func cudnUpdateCases(t *testing.T) []updateCase {
	var out []updateCase
	for _, tc := range updateCases {
		if kindOf(tc.create) == "UserDefinedNetwork" && isCELMessageOf(t, "ClusterUserDefinedNetwork", tc.wantErr) {
			out = append(out, updateCase{name: tc.name + " (as cudn)", create: asCUDN(tc.create), update: asCUDN(tc.update), wantErr: tc.wantErr})
		}
	}
	return out
}

func kindOf(manifest string) string {
	if strings.Contains(manifest, "kind: ClusterUserDefinedNetwork") {
		return "ClusterUserDefinedNetwork"
	}
	return "UserDefinedNetwork"
}

func TestUpdateValidation(t *testing.T) {
	ctx := context.Background()
	for i, tc := range append(updateCases, cudnUpdateCases(t)...) {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("update-%d", i)
			obj := object(t, tc.create, name)
			if err := env.Client.Create(ctx, obj); err != nil {
				t.Fatalf("create: %v", err)
			}
			defer func() { _ = env.Client.Delete(ctx, obj) }()
			upd := object(t, tc.update, name)
			upd.SetResourceVersion(obj.GetResourceVersion())
			checkErr(t, env.Client.Update(ctx, upd), tc.wantErr)
		})
	}
}

func checkErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("rejected, want accepted: %v", err)
	case want != "" && err == nil:
		t.Fatalf("accepted, want rejection %q", want)
	case want != "" && isCELMessage(t, want) && !hasCause(err, want):
		t.Fatalf("rejected with\n  %v\nwant a cause with exactly the CEL message\n  %q", err, want)
	case want != "" && !strings.Contains(err.Error(), want):
		// OpenAPI schema errors (enum, range, required) are the API
		// server's own wording, matched by their distinctive part.
		t.Fatalf("rejected with\n  %v\nwant message containing\n  %q", err, want)
	}
}

func isCELMessage(t *testing.T, msg string) bool {
	t.Helper()
	msgs, err := celMessages()
	if err != nil {
		t.Fatal(err)
	}
	return msgs["UserDefinedNetwork"][msg] || msgs["ClusterUserDefinedNetwork"][msg]
}

func isCELMessageOf(t *testing.T, kind, msg string) bool {
	t.Helper()
	msgs, err := celMessages()
	if err != nil {
		t.Fatal(err)
	}
	return msgs[kind][msg]
}

// celMessages returns the message of every CEL rule in the shipped UDN and
// CUDN CRDs, by kind.
var celMessages = sync.OnceValues(func() (map[string]map[string]bool, error) {
	all := map[string]map[string]bool{}
	var out map[string]bool
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if rules, ok := v["x-kubernetes-validations"].([]any); ok {
				for _, r := range rules {
					if m, ok := r.(map[string]any)["message"].(string); ok {
						out[m] = true
					}
				}
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	for kind, f := range map[string]string{
		"UserDefinedNetwork":        "k8s.ovn.org_userdefinednetworks.yaml",
		"ClusterUserDefinedNetwork": "k8s.ovn.org_clusteruserdefinednetworks.yaml",
	} {
		out = map[string]bool{}
		all[kind] = out
		raw, err := os.ReadFile(filepath.Join(env.Root, "config", "crd", "bases", f))
		if err != nil {
			return nil, err
		}
		var crd map[string]any
		if err := yaml.Unmarshal(raw, &crd); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		walk(crd)
		if len(out) == 0 {
			return nil, fmt.Errorf("%s: no CEL rules found", f)
		}
	}
	return all, nil
})

// hasCause reports whether one of the API server's causes for rejecting
// carries exactly the message want (after the "Invalid value: ...: " or
// "Forbidden: " the API server puts before a rule's message), so that a
// message that is only a prefix of another does not match it.
func hasCause(err error, want string) bool {
	status, ok := err.(apierrors.APIStatus)
	if !ok || status.Status().Details == nil {
		return false
	}
	for _, c := range status.Status().Details.Causes {
		if c.Message == want || strings.HasSuffix(c.Message, ": "+want) {
			return true
		}
	}
	return false
}
