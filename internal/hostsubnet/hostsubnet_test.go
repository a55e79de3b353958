package hostsubnet

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/testenv/netiptest"
)

func l3(name string, subs ...string) Network {
	subnets, err := netconf.ParseLayer3Subnets(strings.Join(subs, ","))
	if err != nil {
		panic(err)
	}
	return Network{Name: name, Subnets: subnets}
}

func TestAssignFreshNodes(t *testing.T) {
	res := Assign([]Network{l3("a", "10.100.0.0/16/24", "fd00:10::/48"), l3("b", "10.100.0.0/16")},
		[]Node{{Name: "n2"}, {Name: "n1"}, {Name: "n3"}})
	if len(res.Problems) != 0 {
		t.Fatalf("problems: %v", res.Problems)
	}
	want := map[string]Subnets{
		"n1": {"a": netiptest.MustPrefixes("10.100.0.0/24", "fd00:10::/64"), "b": netiptest.MustPrefixes("10.100.0.0/24")},
		"n2": {"a": netiptest.MustPrefixes("10.100.1.0/24", "fd00:10:0:1::/64"), "b": netiptest.MustPrefixes("10.100.1.0/24")},
		"n3": {"a": netiptest.MustPrefixes("10.100.2.0/24", "fd00:10:0:2::/64"), "b": netiptest.MustPrefixes("10.100.2.0/24")},
	}
	if !reflect.DeepEqual(res.Nodes, want) {
		t.Fatalf("got %v\nwant %v", res.Nodes, want)
	}
}

// With Nodes set (dynamic allocation), only those nodes hold the
// network: a node left out drops its host subnet, which the next node
// wanting one gets, while a kept node keeps its own.
func TestAssignOnlyListedNodes(t *testing.T) {
	nw := l3("a", "10.100.0.0/16/24")
	nw.Nodes = map[string]bool{"n2": true, "n3": true}
	other := l3("b", "10.200.0.0/16/24") // every node
	res := Assign([]Network{nw, other}, []Node{
		{Name: "n1", Current: Subnets{"a": netiptest.MustPrefixes("10.100.0.0/24")}},
		{Name: "n2"},
		{Name: "n3", Current: Subnets{"a": netiptest.MustPrefixes("10.100.5.0/24")}},
	})
	want := map[string]Subnets{
		"n1": {"b": netiptest.MustPrefixes("10.200.0.0/24")},
		"n2": {"a": netiptest.MustPrefixes("10.100.0.0/24"), "b": netiptest.MustPrefixes("10.200.1.0/24")},
		"n3": {"a": netiptest.MustPrefixes("10.100.5.0/24"), "b": netiptest.MustPrefixes("10.200.2.0/24")},
	}
	if len(res.Problems) != 0 || !reflect.DeepEqual(res.Nodes, want) {
		t.Fatalf("got %v (problems %v)\nwant %v", res.Nodes, res.Problems, want)
	}
	// An empty, non-nil set: no node holds the network.
	nw.Nodes = map[string]bool{}
	res = Assign([]Network{nw}, []Node{{Name: "n2", Current: want["n2"]}})
	if got := res.Nodes["n2"]; len(got) != 0 {
		t.Fatalf("no node wants network a, n2 holds %v", got)
	}
}

func TestAssignKeepsAndRepairs(t *testing.T) {
	nw := l3("a", "10.100.0.0/16/24")
	res := Assign([]Network{nw}, []Node{
		{Name: "n1", Current: Subnets{"a": netiptest.MustPrefixes("10.100.7.0/24"), "gone": netiptest.MustPrefixes("10.1.0.0/24")}},
		{Name: "n2", Current: Subnets{"a": netiptest.MustPrefixes("10.100.7.0/24")}}, // duplicate of n1's: replaced
		{Name: "n3", Current: Subnets{"a": netiptest.MustPrefixes("10.200.0.0/24")}}, // outside the cluster subnet
		{Name: "n4", Current: Subnets{"a": netiptest.MustPrefixes("10.100.9.0/25")}}, // wrong length
		{Name: "n5", Current: Subnets{"a": netiptest.MustPrefixes("10.100.0.0/24")}}, // valid: kept
	})
	want := map[string]Subnets{
		"n1": {"a": netiptest.MustPrefixes("10.100.7.0/24")},
		"n2": {"a": netiptest.MustPrefixes("10.100.1.0/24")},
		"n3": {"a": netiptest.MustPrefixes("10.100.2.0/24")},
		"n4": {"a": netiptest.MustPrefixes("10.100.3.0/24")},
		"n5": {"a": netiptest.MustPrefixes("10.100.0.0/24")},
	}
	if !reflect.DeepEqual(res.Nodes, want) {
		t.Fatalf("got %v\nwant %v", res.Nodes, want)
	}
	// Planning again from the result changes nothing: restarts keep
	// every assignment.
	var again []Node
	for name, s := range res.Nodes {
		again = append(again, Node{Name: name, Current: s})
	}
	if res2 := Assign([]Network{nw}, again); !reflect.DeepEqual(res2.Nodes, want) {
		t.Fatalf("second plan moved subnets: %v", res2.Nodes)
	}
}

func TestAssignFreesRemovedNode(t *testing.T) {
	nw := l3("a", "10.100.0.0/16/24")
	res := Assign([]Network{nw}, []Node{
		{Name: "n1", Current: Subnets{"a": netiptest.MustPrefixes("10.100.0.0/24")}},
		{Name: "n3", Current: Subnets{"a": netiptest.MustPrefixes("10.100.2.0/24")}},
		{Name: "n4"},
	})
	// n2 (10.100.1.0/24) is gone: its subnet is the lowest free one.
	if got := res.Nodes["n4"]["a"]; !reflect.DeepEqual(got, netiptest.MustPrefixes("10.100.1.0/24")) {
		t.Fatalf("n4 got %v, want the freed 10.100.1.0/24", got)
	}
}

func TestAssignExhausted(t *testing.T) {
	res := Assign([]Network{l3("small", "10.0.0.0/23/24", "fd00::/63/64"), l3("ok", "10.9.0.0/16")},
		[]Node{{Name: "n1"}, {Name: "n2"}, {Name: "n3"}})
	if _, has := res.Nodes["n3"]["small"]; has {
		t.Fatalf("n3 got a subnet of an exhausted network: %v", res.Nodes["n3"])
	}
	if _, has := res.Nodes["n3"]["ok"]; !has {
		t.Fatalf("n3 lost network ok: %v", res.Nodes["n3"])
	}
	want := []string{
		`network "small": subnet "10.0.0.0/23" has no free /24 host subnet for node "n3"`,
		`network "small": subnet "fd00::/63" has no free /64 host subnet for node "n3"`,
	}
	if !reflect.DeepEqual(res.Problems, want) {
		t.Fatalf("problems %q, want %q", res.Problems, want)
	}
}

func TestAssignInvalidNetwork(t *testing.T) {
	res := Assign([]Network{l3("bad", "10.0.0.0/24/16"), l3("v4host32", "10.1.0.0/16/32")}, []Node{{Name: "n1"}})
	if len(res.Nodes["n1"]) != 0 || len(res.Problems) != 2 {
		t.Fatalf("nodes %v problems %q", res.Nodes, res.Problems)
	}
	if !strings.Contains(res.Problems[0], `network "bad": subnet "10.0.0.0/24": host subnet length /16`) {
		t.Fatalf("problem does not name network, subnet and length: %q", res.Problems[0])
	}
}

func TestParseFormat(t *testing.T) {
	s := Subnets{"b": netiptest.MustPrefixes("10.1.0.0/24"), "a": netiptest.MustPrefixes("10.100.3.0/24", "fd00::/64")}
	v := Format(s)
	if v != `{"a":["10.100.3.0/24","fd00::/64"],"b":["10.1.0.0/24"]}` {
		t.Fatalf("Format = %s", v)
	}
	back, err := Parse(v)
	if err != nil || !Equal(back, s) {
		t.Fatalf("Parse(Format) = %v, %v", back, err)
	}
	for _, bad := range []string{`{"a":["10.0.0.1/24"]}`, `{"a":["x"]}`, `[]`, `{"":["10.0.0.0/24"]}`} {
		if _, err := Parse(bad); err == nil || !strings.Contains(err.Error(), Annotation) {
			t.Errorf("Parse(%s) = %v, want an error naming the annotation", bad, err)
		}
	}
}

func TestHostSubnetOfAndGateway(t *testing.T) {
	nw := l3("a", "10.100.0.0/16/24", "fd00::/48")
	if p, ok := nw.HostSubnetOf(netip.MustParseAddr("10.100.3.9")); !ok || p != netip.MustParsePrefix("10.100.3.0/24") {
		t.Fatalf("HostSubnetOf v4 = %v %v", p, ok)
	}
	if p, ok := nw.HostSubnetOf(netip.MustParseAddr("fd00:0:0:5::9")); !ok || p != netip.MustParsePrefix("fd00:0:0:5::/64") {
		t.Fatalf("HostSubnetOf v6 = %v %v", p, ok)
	}
	if _, ok := nw.HostSubnetOf(netip.MustParseAddr("10.101.0.1")); ok {
		t.Fatal("address outside the network has a host subnet")
	}
	if g := Gateway(netip.MustParsePrefix("10.100.3.0/24")); g != netip.MustParseAddr("10.100.3.1") {
		t.Fatalf("Gateway = %v", g)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(`{"a":["10.100.3.0/24","fd00::/64"]}`)
	f.Add(`{"a":[]}`)
	f.Add(`nope`)
	f.Fuzz(func(t *testing.T, v string) {
		s, err := Parse(v)
		if err != nil {
			return
		}
		back, err := Parse(Format(s))
		if len(s) == 0 {
			return // Format("") is not an annotation
		}
		if err != nil || !Equal(back, s) {
			t.Fatalf("round trip of %q: %v, %v", v, back, err)
		}
	})
}
