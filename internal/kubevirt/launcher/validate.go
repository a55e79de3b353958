package launcher

import (
	"errors"
	"fmt"
	"net"
	"regexp"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
)

// ErrInvalidNetworkSpec marks a VMI whose network configuration KubeVirt's
// admission would reject. kvnet checks it first so that it never reserves
// MACs or IPs for a VMI that will not run.
var ErrInvalidNetworkSpec = errors.New("invalid VMI network spec")

// ReservedMAC is the MAC KubeVirt gives the masquerade bridge (k6t-eth0); a
// guest NIC with it would collide with its own gateway.
const ReservedMAC = "02:00:00:00:00:00"

// validInterfaceName is KubeVirt's rule for interface names: they become
// parts of libvirt aliases and file names.
var validInterfaceName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Validate checks the VMI network rules relevant to kvnet and returns every
// violation, each naming the field and wrapping ErrInvalidNetworkSpec:
//   - every interface name matches a network;
//   - interface names use only [A-Za-z0-9-_];
//   - at most one pod network and at most one Multus default network, and
//     not both;
//   - masquerade only on the pod network;
//   - state: absent only with bridge binding and never on the pod or Multus
//     default network;
//   - the MAC, when set, parses as a 6-byte MAC and is not 02:00:00:00:00:00;
//   - each interface has exactly one binding method (bridge, masquerade,
//     sriov, passtBinding or binding) and a binding names its plugin.
func Validate(vmi *kubevirtv1.VirtualMachineInstance) error {
	if vmi == nil {
		return fmt.Errorf("%w: vmi is nil", ErrInvalidNetworkSpec)
	}
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidNetworkSpec}, args...)...))
	}

	networks := map[string]kubevirtv1.Network{}
	podNetwork, multusDefault := -1, -1
	for i, n := range vmi.Spec.Networks {
		if _, dup := networks[n.Name]; !dup {
			networks[n.Name] = n
		}
		if n.Pod != nil {
			if podNetwork >= 0 {
				fail("spec.networks[%d] %q: more than one pod network (spec.networks[%d] %q is one already)",
					i, n.Name, podNetwork, vmi.Spec.Networks[podNetwork].Name)
			} else {
				podNetwork = i
			}
		}
		if isMultusDefault(n) {
			if multusDefault >= 0 {
				fail("spec.networks[%d].multus.default of %q: more than one multus default network (spec.networks[%d] %q is one already)",
					i, n.Name, multusDefault, vmi.Spec.Networks[multusDefault].Name)
			} else {
				multusDefault = i
			}
		}
	}
	if podNetwork >= 0 && multusDefault >= 0 {
		fail("spec.networks[%d] %q: pod network and multus default network spec.networks[%d] %q cannot both be set",
			podNetwork, vmi.Spec.Networks[podNetwork].Name, multusDefault, vmi.Spec.Networks[multusDefault].Name)
	}

	for i, iface := range vmi.Spec.Domain.Devices.Interfaces {
		field := fmt.Sprintf("spec.domain.devices.interfaces[%d]", i)
		if !validInterfaceName.MatchString(iface.Name) {
			fail("%s.name %q: only letters, digits, '-' and '_' are allowed", field, iface.Name)
		}

		for _, removed := range []struct {
			set  bool
			name string
		}{{iface.DeprecatedSlirp != nil, "slirp"}, {iface.DeprecatedMacvtap != nil, "macvtap"}, {iface.DeprecatedPasst != nil, "passt"}} {
			if removed.set {
				fail("%s.%s of %q: the %s binding was removed in KubeVirt v1.3; use passtBinding or a binding plugin", field, removed.name, iface.Name, removed.name)
			}
		}
		methods := bindingMethods(iface)
		switch {
		case len(methods) == 0:
			fail("%s %q: no binding method; set exactly one of bridge, masquerade, sriov, passtBinding or binding", field, iface.Name)
		case len(methods) > 1:
			fail("%s %q: binding methods %v are mutually exclusive", field, iface.Name, methods)
		}
		if iface.Binding != nil && iface.Binding.Name == "" {
			fail("%s.binding.name of %q: must name a binding plugin", field, iface.Name)
		}

		if iface.MacAddress != "" {
			mac, err := net.ParseMAC(iface.MacAddress)
			switch {
			case err != nil:
				fail("%s.macAddress %q of %q: malformed: %v", field, iface.MacAddress, iface.Name, err)
			case len(mac) != 6:
				fail("%s.macAddress %q of %q: want a 6-byte MAC, got %d bytes", field, iface.MacAddress, iface.Name, len(mac))
			case mac.String() == ReservedMAC:
				fail("%s.macAddress %q of %q: reserved for the masquerade bridge", field, iface.MacAddress, iface.Name)
			}
		}

		network, ok := networks[iface.Name]
		if !ok {
			fail("%s.name %q: no network of that name in spec.networks", field, iface.Name)
			// The remaining rules depend on the network's kind.
			continue
		}
		if iface.Masquerade != nil && network.Pod == nil {
			fail("%s.masquerade of %q: masquerade is only supported on the pod network", field, iface.Name)
		}
		if iface.State == kubevirtv1.InterfaceStateAbsent {
			if iface.Bridge == nil {
				fail("%s.state %q of %q: only supported with bridge binding", field, iface.State, iface.Name)
			}
			if network.Pod != nil || isMultusDefault(network) {
				fail("%s.state %q of %q: not supported on the default (pod or multus default) network", field, iface.State, iface.Name)
			}
		}
	}
	return errors.Join(errs...)
}

// bindingMethods lists the binding methods an interface sets, in the order
// KubeVirt documents them.
func bindingMethods(iface kubevirtv1.Interface) []string {
	var m []string
	if iface.Bridge != nil {
		m = append(m, "bridge")
	}
	if iface.Masquerade != nil {
		m = append(m, "masquerade")
	}
	if iface.SRIOV != nil {
		m = append(m, "sriov")
	}
	if iface.PasstBinding != nil {
		m = append(m, "passtBinding")
	}
	if iface.Binding != nil {
		m = append(m, "binding")
	}
	return m
}
