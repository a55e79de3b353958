package udn

import (
	"fmt"
	"net/netip"

	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/reserved"
)

// overlapPrefix starts the message of a network whose subnets overlap a
// reserved one: OVN-Kubernetes' words for the same refusal.
const overlapPrefix = "invalid subnet configuration: pod or join subnet overlaps with already configured internal subnets: "

// checkReserved refuses a rendered network whose subnets or join subnets
// overlap the cluster's reserved subnets r, as OVN-Kubernetes does: every
// overlay network against the masquerade subnets, Layer3 networks also
// against the transit subnets (a primary Layer2 network's transit subnet
// moves out of the way instead), and a primary network's subnets against
// its join subnets. Localnet networks are the physical network's and are
// not checked. The error names both subnets and the flag that sets the
// reserved one.
func checkReserved(c *netconf.NetConf, r reserved.Subnets) error {
	if c.Topology == netconf.TopologyLocalnet {
		return nil
	}
	var subnets []netip.Prefix
	if c.Topology == netconf.TopologyLayer3 {
		l3, err := netconf.ParseLayer3Subnets(c.Subnets)
		if err != nil {
			return err
		}
		for _, s := range l3 {
			subnets = append(subnets, s.CIDR.Masked())
		}
	} else {
		l, err := netconf.ParsePrefixes("subnets", c.Subnets)
		if err != nil {
			return err
		}
		for _, p := range l {
			subnets = append(subnets, p.Masked())
		}
	}
	join, err := netconf.ParsePrefixes("joinSubnet", c.JoinSubnet)
	if err != nil {
		return err
	}
	userJoin := c.JoinSubnet != "" && c.JoinSubnet != reserved.Join(r.Join)
	checks := []struct {
		list     []netip.Prefix
		flagName string
		against  []netip.Prefix
		what     string
	}{
		{r.Masquerade, "masquerade-subnets", subnets, "user defined subnet"},
	}
	if userJoin {
		checks = append(checks, struct {
			list     []netip.Prefix
			flagName string
			against  []netip.Prefix
			what     string
		}{r.Masquerade, "masquerade-subnets", join, "user defined join subnet"})
	}
	if c.Topology == netconf.TopologyLayer3 {
		checks = append(checks, struct {
			list     []netip.Prefix
			flagName string
			against  []netip.Prefix
			what     string
		}{r.Transit, "transit-subnets", subnets, "user defined subnet"})
	}
	for _, ch := range checks {
		if msg := reserved.Overlap(ch.list, ch.flagName, ch.against, ch.what); msg != "" {
			return fmt.Errorf("%s%s", overlapPrefix, msg)
		}
	}
	if c.IsPrimary() {
		for _, j := range join {
			for _, s := range subnets {
				if !j.Overlaps(s) {
					continue
				}
				if userJoin {
					return fmt.Errorf("%suser defined join subnet %q overlaps user defined subnet %q", overlapPrefix, j, s)
				}
				return fmt.Errorf("%sjoin subnet %q (kvnet-controller --join-subnets) overlaps user defined subnet %q: set spec.layer2.joinSubnets or spec.layer3.joinSubnets to a free range", overlapPrefix, j, s)
			}
		}
	}
	return nil
}
