package datapath

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"

	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/testenv"
)

// The golden tests (nftrules_test.go) compare the text kvnet renders next
// to its netlink expressions; nothing there shows that the kernel holds
// rules meaning that text. TestNftRulesInKernel programs the golden state
// into a fresh namespace with syncTables (what Apply does), reads the
// ruleset back as nft decodes it (`nft -j list ruleset`, an independent
// decoder of the kernel's expressions) and checks that every table, chain
// and rule is there and means what was intended — so a rule that is
// missing, out of place, or encoded with a wrong offset or operator fails
// it.

// kernelRule is one rule as nft decodes it from the kernel.
type kernelRule struct {
	Family, Chain string
	Text          string // canonical text built from nft's JSON expressions
	Comment       string
}

// kernelRuleset is what `nft -j list ruleset` reports for the kvnet tables
// of one namespace.
type kernelRuleset struct {
	Families []string          // of the kvnet tables, in listing order
	Chains   map[string]string // "family chain" -> base chain spec ("" for a regular chain)
	Rules    []kernelRule      // in listing order
	// Maps are the named maps: "family name" -> its type, then its
	// elements ("key comment "..." : jump chain"), sorted.
	Maps map[string][]string
}

// listKernelRuleset runs `nft -j list ruleset` in the named namespace and
// returns its kvnet tables; other tables fail t (the namespace is fresh).
func listKernelRuleset(t *testing.T, nsName string) kernelRuleset {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		// Fail rather than skip: a missing tool must not pass as green.
		t.Fatalf("nft (nftables) not in PATH (hack/install-deps.sh installs it): %v", err)
	}
	out, err := exec.Command("ip", "netns", "exec", nsName, "nft", "-j", "list", "ruleset").Output()
	if err != nil {
		t.Fatalf("nft -j list ruleset in %s: %v", nsName, err)
	}
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("decode nft -j output: %v\n%s", err, out)
	}
	rs := kernelRuleset{Chains: map[string]string{}, Maps: map[string][]string{}}
	for _, obj := range doc.Nftables {
		switch {
		case obj["table"] != nil:
			var tb struct{ Family, Name string }
			mustUnmarshal(t, obj["table"], &tb)
			if tb.Name != tableName {
				t.Errorf("kernel holds table %s %s, which kvnet never programs", tb.Family, tb.Name)
				continue
			}
			rs.Families = append(rs.Families, tb.Family)
		case obj["chain"] != nil:
			var c struct {
				Family, Table, Name, Type, Hook, Policy string
				Prio                                    *int
			}
			mustUnmarshal(t, obj["chain"], &c)
			spec := ""
			if c.Hook != "" {
				prio := "?"
				if c.Prio != nil {
					prio = fmt.Sprint(*c.Prio)
				}
				spec = fmt.Sprintf("type %s hook %s priority %s; policy %s;", c.Type, c.Hook, prio, c.Policy)
			}
			rs.Chains[c.Family+" "+c.Name] = spec
		case obj["map"] != nil:
			var m struct {
				Family, Name, Map string
				Type              json.RawMessage
				Elem              [][2]json.RawMessage
			}
			mustUnmarshal(t, obj["map"], &m)
			var types []string
			if json.Unmarshal(m.Type, &types) != nil {
				types = []string{string(m.Type)}
			}
			var elems []string
			for _, e := range m.Elem {
				elems = append(elems, nftElemText(e[0])+" : "+nftExprText(mustMap(t, e[1])))
			}
			slices.Sort(elems)
			rs.Maps[m.Family+" "+m.Name] = append([]string{"type " + strings.Join(types, " . ") + " : " + m.Map}, elems...)
		case obj["rule"] != nil:
			var r struct {
				Family, Chain, Comment string
				Expr                   []map[string]json.RawMessage
			}
			mustUnmarshal(t, obj["rule"], &r)
			words := make([]string, 0, len(r.Expr))
			for _, e := range r.Expr {
				words = append(words, nftExprText(e))
			}
			rs.Rules = append(rs.Rules, kernelRule{Family: r.Family, Chain: r.Chain, Text: strings.Join(words, " "), Comment: r.Comment})
		}
	}
	return rs
}

// nftElemText renders a map element's key (a concatenation, with or
// without a comment) as nft lists it.
func nftElemText(b json.RawMessage) string {
	var e struct {
		Elem *struct {
			Val     json.RawMessage
			Comment string
		}
	}
	comment := ""
	if json.Unmarshal(b, &e) == nil && e.Elem != nil {
		b, comment = e.Elem.Val, fmt.Sprintf(" comment %q", e.Elem.Comment)
	}
	var c struct{ Concat []json.RawMessage }
	if json.Unmarshal(b, &c) != nil || c.Concat == nil {
		return string(b)
	}
	parts := make([]string, len(c.Concat))
	for i, v := range c.Concat {
		parts[i] = nftRightText(v, false)
	}
	return strings.Join(parts, " . ") + comment
}

func mustMap(t *testing.T, b json.RawMessage) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	mustUnmarshal(t, b, &m)
	return m
}

func mustUnmarshal(t *testing.T, b json.RawMessage, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
}

// nftExprText renders one expression of nft's JSON the way `nft list`
// prints it, for the expressions kvnet uses; any other expression (say, a
// raw payload match nft could not name) is rendered as its JSON, so that
// it cannot compare equal to intended text.
func nftExprText(e map[string]json.RawMessage) string {
	raw := func() string { b, _ := json.Marshal(e); return string(b) }
	if len(e) != 1 {
		return raw()
	}
	for k, v := range e {
		switch k {
		case "counter":
			return "counter" // values vary; presence is what is intended
		case "drop", "accept", "return", "masquerade", "notrack":
			if string(v) != "null" {
				return raw()
			}
			return k
		case "vmap":
			var m struct {
				Key  struct{ Concat []json.RawMessage }
				Data string
			}
			if json.Unmarshal(v, &m) != nil || len(m.Key.Concat) == 0 {
				return raw()
			}
			parts := make([]string, len(m.Key.Concat))
			for i, c := range m.Key.Concat {
				if parts[i], _ = nftLeftText(c); parts[i] == "" {
					return raw()
				}
			}
			return strings.Join(parts, " . ") + " vmap " + m.Data
		case "jump":
			var j struct{ Target string }
			if json.Unmarshal(v, &j) != nil {
				return raw()
			}
			return "jump " + j.Target
		case "mangle":
			var m struct {
				Key   json.RawMessage
				Value json.Number
			}
			if json.Unmarshal(v, &m) != nil {
				return raw()
			}
			key, _ := nftLeftText(m.Key)
			if key != "meta mark" && key != "ct mark" && key != "ct zone" {
				return raw()
			}
			return key + " set " + m.Value.String()
		case "dnat":
			var d struct {
				Family string
				Addr   json.RawMessage
				Port   int
			}
			if json.Unmarshal(v, &d) != nil || len(d.Addr) == 0 {
				return raw()
			}
			var text string
			if json.Unmarshal(d.Addr, &text) != nil {
				// An address taken from the packet: `dnat ip to ip daddr`.
				if from, _ := nftLeftText(d.Addr); from != "" && d.Port == 0 {
					return fmt.Sprintf("dnat %s to %s", d.Family, from)
				}
				return raw()
			}
			addr, err := netip.ParseAddr(text)
			if err != nil {
				return raw()
			}
			if d.Port == 0 {
				return fmt.Sprintf("dnat %s to %s", d.Family, addr)
			}
			return fmt.Sprintf("dnat %s to %s", d.Family, netip.AddrPortFrom(addr, uint16(d.Port)))
		case "reject":
			var r struct{ Type, Expr string }
			if json.Unmarshal(v, &r) != nil {
				return raw()
			}
			if r.Type == "tcp reset" {
				return "reject with tcp reset"
			}
			return "reject with " + r.Type + " " + r.Expr
		case "set":
			var u struct {
				Op   string
				Elem struct {
					Elem struct {
						Val     json.RawMessage
						Timeout int
					}
				}
				Set string
			}
			if json.Unmarshal(v, &u) != nil || u.Op != "update" {
				return raw()
			}
			val, _ := nftLeftText(u.Elem.Elem.Val)
			if val == "" {
				return raw()
			}
			return fmt.Sprintf("update %s { %s timeout %ds }", u.Set, val, u.Elem.Elem.Timeout)
		case "match":
			var m struct {
				Op          string
				Left, Right json.RawMessage
			}
			if json.Unmarshal(v, &m) != nil {
				return raw()
			}
			left, quote := nftLeftText(m.Left)
			right := nftRightText(m.Right, quote)
			if left == "" || right == "" {
				return raw()
			}
			switch m.Op {
			case "==", "in": // "in": any of the flags (ct state a,b)
				return left + " " + right
			case "!=", "!":
				return left + " " + m.Op + " " + right
			}
		}
	}
	return raw()
}

// nftLeftText renders the left side of a match; quote reports whether its
// values are strings nft quotes (interface names).
func nftLeftText(b json.RawMessage) (text string, quote bool) {
	var l struct {
		Meta    *struct{ Key string }
		Payload *struct{ Protocol, Field string }
		Ct      *struct{ Key string }
		Fib     *struct {
			Result string
			Flags  []string
		}
		Numgen *struct {
			Mode   string
			Mod    int
			Offset int
		}
	}
	if json.Unmarshal(b, &l) != nil {
		return "", false
	}
	switch {
	case l.Numgen != nil && l.Numgen.Offset == 0:
		return fmt.Sprintf("numgen %s mod %d", l.Numgen.Mode, l.Numgen.Mod), false
	case l.Meta != nil && (l.Meta.Key == "iifname" || l.Meta.Key == "oifname"):
		return l.Meta.Key, true
	case l.Meta != nil:
		return "meta " + l.Meta.Key, false
	case l.Payload != nil && l.Payload.Protocol != "":
		return l.Payload.Protocol + " " + l.Payload.Field, false
	case l.Ct != nil:
		return "ct " + l.Ct.Key, false
	case l.Fib != nil && len(l.Fib.Flags) == 1:
		return "fib " + l.Fib.Flags[0] + " " + l.Fib.Result, false
	}
	return "", false
}

// nftRightText renders the right side of a match: a string, a number, a
// prefix or a list (of ct states).
func nftRightText(b json.RawMessage, quote bool) string {
	var s string
	if json.Unmarshal(b, &s) == nil {
		if quote {
			return fmt.Sprintf("%q", s)
		}
		return s
	}
	var n json.Number
	if json.Unmarshal(b, &n) == nil {
		return n.String()
	}
	var p struct {
		Prefix *struct {
			Addr string
			Len  int
		}
	}
	if json.Unmarshal(b, &p) == nil && p.Prefix != nil {
		return fmt.Sprintf("%s/%d", p.Prefix.Addr, p.Prefix.Len)
	}
	var list []string
	if json.Unmarshal(b, &list) == nil {
		return strings.Join(list, ",")
	}
	return ""
}

// nftElided are the protocol dependencies nft leaves out when it lists a
// rule because the next match implies them (kvnet states them, as nft
// does when it loads `ip saddr ...` in the bridge family).
var nftElided = strings.NewReplacer(
	"ether type ip ip ", "ip ",
	"ether type ip6 ip6 ", "ip6 ",
	"ether type arp arp ", "arp ",
	"meta nfproto ipv4 ip ", "ip ",
	"meta nfproto ipv6 ip6 ", "ip6 ",
	"meta nfproto ipv4 update ", "update ",
	"meta nfproto ipv6 update ", "update ",
	"meta nfproto ipv4 dnat ip to ip daddr", "dnat ip to ip daddr",
	"meta nfproto ipv6 dnat ip6 to ip6 daddr", "dnat ip6 to ip6 daddr",
	"meta l4proto udp udp ", "udp ",
	"meta l4proto tcp tcp ", "tcp ",
)

// intendedRuleset is what the kernel must hold after syncTables(want),
// in the form listKernelRuleset returns.
func intendedRuleset(want []nftTable) kernelRuleset {
	rs := kernelRuleset{Chains: map[string]string{}, Maps: map[string][]string{}}
	for _, tb := range want {
		fam := familyNames[tb.family]
		rs.Families = append(rs.Families, fam)
		for _, m := range tb.vmaps {
			var elems []string
			for _, e := range m.elems {
				elems = append(elems, fmt.Sprintf("%s comment %q : jump %s", e.text, e.comment, e.chain))
			}
			slices.Sort(elems)
			rs.Maps[fam+" "+m.name] = append([]string{"type " + m.keyType.Name + " : verdict"}, elems...)
		}
		for _, c := range tb.chains {
			spec := ""
			if b := c.base; b != nil {
				hook := hookNames[b.hook]
				if tb.family == nftables.TableFamilyARP {
					hook = map[nftables.ChainHook]string{*arpHookIn: "input", *arpHookOut: "output"}[b.hook]
				}
				policy := "accept"
				if b.policy == nftables.ChainPolicyDrop {
					policy = "drop"
				}
				spec = fmt.Sprintf("type %s hook %s priority %d; policy %s;", b.typ, hook, b.priority, policy)
			}
			rs.Chains[fam+" "+c.name] = spec
			for _, r := range c.rules {
				text := nftElided.Replace(strings.Join(r.text, " ") + " ")
				rs.Rules = append(rs.Rules, kernelRule{Family: fam, Chain: c.name, Text: strings.TrimSuffix(text, " "), Comment: r.comment})
			}
		}
	}
	return rs
}

// String renders a ruleset one line per table, chain and rule, tables and
// chains sorted, rules in order within their chain, for comparison.
func (rs kernelRuleset) String() string {
	var lines []string
	for _, f := range rs.Families {
		lines = append(lines, "table "+f)
	}
	for fc, spec := range rs.Chains {
		lines = append(lines, fmt.Sprintf("chain %s {%s}", fc, spec))
	}
	for fm, m := range rs.Maps {
		lines = append(lines, fmt.Sprintf("map %s {%s}", fm, strings.Join(m, "; ")))
	}
	slices.Sort(lines)
	byChain := map[string][]string{}
	var order []string
	for _, r := range rs.Rules {
		k := r.Family + " " + r.Chain
		if byChain[k] == nil {
			order = append(order, k)
		}
		byChain[k] = append(byChain[k], fmt.Sprintf("rule %s: %s comment %q", k, r.Text, r.Comment))
	}
	slices.Sort(order)
	for _, k := range order {
		lines = append(lines, byChain[k]...)
	}
	return strings.Join(lines, "\n")
}

// has reports whether rs holds rule text (as nft lists it, without
// counter values) in chain chain of family fam.
func (rs kernelRuleset) has(fam, chain, text string) bool {
	return slices.ContainsFunc(rs.Rules, func(r kernelRule) bool {
		return r.Family == fam && r.Chain == chain && r.Text == text
	})
}

// programInNewNS applies tables to a fresh namespace as Apply does and
// returns the namespace's name.
func programInNewNS(t *testing.T, role string, tables []nftTable) string {
	t.Helper()
	name := fmt.Sprintf("kvnft-%s-%d", role, os.Getpid())
	path, err := nl.CreateNamedNS(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nl.DeleteNamedNS(name) })
	if err := withNS(path, func(fd int) error {
		conn, err := nftConn(fd)
		if err != nil {
			return err
		}
		return syncTables(conn, tables)
	}); err != nil {
		t.Fatalf("program %s rules: %v", role, err)
	}
	return name
}

func TestNftRulesInKernel(t *testing.T) {
	testenv.NeedsRoot(t)
	state := goldenState()
	tests := []struct {
		role   string
		tables []nftTable
		// must are rules (as nft lists them, counters without values)
		// written out by hand, at least one per family kvnet programs,
		// so that a rule the rule builder itself lost fails too.
		must []struct{ family, chain, text string }
		// chains are base chain specs written out by hand.
		chains map[string]string
		// maps are map types and elements written out by hand, by
		// "family name".
		maps map[string][]string
	}{{
		role:   "node",
		tables: nodeRules(state),
		must: []struct{ family, chain, text string }{
			// bridge: anti-spoofing of a port, by MAC, IPv4, IPv6 and ARP.
			{"bridge", "prerouting", `iifname "pa1" jump port-pa1`},
			{"bridge", "port-pa1", `ether saddr != 02:00:00:00:00:01 counter drop`},
			{"bridge", "port-pa1", `ip saddr 10.1.1.2 return`},
			{"bridge", "port-pa1", `ether type ip counter drop`},
			{"bridge", "port-pa1", `ip6 saddr fd00:1::2 return`},
			{"bridge", "port-pa1", `ip6 saddr fe80::/10 return`},
			{"bridge", "port-pa1", `ether type ip6 counter drop`},
			{"bridge", "port-pa1", `arp saddr ether != 02:00:00:00:00:01 counter drop`},
			{"bridge", "port-pa1", `arp saddr ip 10.1.1.2 return`},
			{"bridge", "port-pa2", `ether saddr != 02:00:00:00:00:02 counter drop`},
			{"bridge", "port-l2p", `ether saddr != 02:00:00:00:00:03 counter drop`},
			// inet: tenant egress SNAT, node isolation, IPv4 and IPv6.
			{"inet", "postrouting", `iifname "kvtr*" masquerade`},
			{"inet", "input", `iifname "kvbr*" counter drop`},
			{"inet", "input", `iifname "kvtr1" ip daddr 169.254.0.0/17 ip daddr != 169.254.0.12 counter drop`},
			{"inet", "input", `iifname "kvtr1" ip6 daddr fd69::/112 ip6 daddr != fd69::c counter drop`},
			{"inet", "forward", `oifname "kvtr*" ct state ! established,related counter drop`},
			// arp: tenant ARP never reaches the node.
			{"arp", "input", `iifname "kvbr*" counter drop`},
			{"arp", "output", `oifname "kvbr*" counter drop`},
		},
		chains: map[string]string{
			"bridge prerouting": "type filter hook prerouting priority -200; policy accept;",
			"inet postrouting":  "type nat hook postrouting priority 100; policy accept;",
			"arp input":         "type filter hook input priority 0; policy accept;",
		},
	}, {
		role:   "node-services",
		tables: nodeRules(goldenServiceState()),
		must: []struct{ family, chain, text string }{
			{"inet", "node-ports-in", `fib daddr type local meta l4proto . th dport vmap @node-ports`},
			{"inet", "node-ports-in", `ip daddr . meta l4proto . th dport vmap @external-ips4`},
			{"inet", "node-ports-local", `ip6 daddr != ::1 fib daddr type local meta l4proto . th dport vmap @node-ports`},
			{"inet", "router-1", `meta nfproto ipv4 dnat ip to 169.254.0.11`},
			{"inet", "router-1", `meta nfproto ipv6 dnat ip6 to fd69::b`},
			{"inet", "ext-ej2lefnw-a/web_http", `dnat ip to 169.254.0.11:30080`},
			{"inet", "forward", `oifname "kvtr*" ct status dnat accept`},
			{"inet", "forward", `iifname "kvtr*" ip daddr . meta l4proto vmap @node-addrs4`},
			{"inet", "to-node", `meta l4proto . th dport vmap @tenant-node-ports`},
			{"inet", "refuse-node-port", `counter reject with icmpx admin-prohibited`},
		},
		chains: map[string]string{
			"inet node-ports-in":    "type nat hook prerouting priority -110; policy accept;",
			"inet node-ports-local": "type nat hook output priority -110; policy accept;",
		},
		maps: map[string][]string{
			"inet node-ports": {"type inet_proto . inet_service : verdict",
				`tcp . 30080 comment "service a/web:http" : jump router-1`,
				`udp . 30053 comment "service a/dns:dns" : jump router-1`},
			"inet external-ips6": {"type ipv6_addr . inet_proto . inet_service : verdict",
				`2001:db8::10 . tcp . 80 comment "service a/web6:http" : jump ext-onz2lysf-a/web6_http`},
			"inet node-addrs4": {"type ipv4_addr . inet_proto : verdict",
				`192.168.100.1 . tcp comment "a node's address" : jump to-node`,
				`192.168.100.1 . udp comment "a node's address" : jump to-node`,
				`192.168.100.2 . tcp comment "a node's address" : jump to-node`,
				`192.168.100.2 . udp comment "a node's address" : jump to-node`},
		},
	}, {
		// The node's chain for tracked bridged frames alone (the rest of
		// the policy rules is read back in TestPolicyEnforcement's
		// traffic, not here).
		role:   "node-policies",
		tables: onlyChains(nodeRules(withPolicies(goldenState())), nftables.TableFamilyINet, "prerouting", "policy-nat-pin"),
		must: []struct{ family, chain, text string }{
			// Frames to and from the Service ranges stay untracked.
			{"inet", "prerouting", `iifname "kvbr1" ip daddr 10.96.0.0/16 notrack accept`},
			{"inet", "prerouting", `iifname "kvbr1" ip6 saddr fd00:96::/112 notrack accept`},
			{"inet", "prerouting", `iifname "kvbr1" ct zone set 1 accept`},
			// Tracked bridged frames: no Service proxy translates them.
			{"inet", "policy-nat-pin", `iifname "kvbr1" dnat ip to ip daddr`},
			{"inet", "policy-nat-pin", `iifname "kvbr1" dnat ip6 to ip6 daddr`},
		},
		chains: map[string]string{
			"inet policy-nat-pin": "type nat hook prerouting priority -120; policy accept;",
		},
	}, {
		role:   "router",
		tables: routerRules(state.Networks[1], nil, nil),
		must: []struct{ family, chain, text string }{
			{"inet", "postrouting", `oifname "transit" masquerade`},
			{"inet", "forward", `iifname "gw" oifname "transit" accept`},
			{"inet", "forward", `counter drop`},
		},
		chains: map[string]string{
			"inet forward":     "type filter hook forward priority 0; policy drop;",
			"inet postrouting": "type nat hook postrouting priority 100; policy accept;",
		},
	}, {
		role:   "router-services",
		tables: routerRules(withServiceAddrs(goldenState()).Networks[1], goldenServices(), nil),
		must: []struct{ family, chain, text string }{
			{"inet", "prerouting", `iifname "gw" ip daddr . meta l4proto . th dport vmap @service-ips4`},
			{"inet", "svc-ooakdqon-a/web_http", `numgen random mod 3 0 meta mark set 19286 ct mark set 19286 dnat ip to 10.1.1.2:8080`},
			{"inet", "svc-ooakdqon-a/web_http", `meta mark set 19286 ct mark set 19286 dnat ip to 10.1.1.4:8080`},
			{"inet", "prerouting", `iifname "gw" ip6 daddr . meta l4proto . th dport vmap @service-ips6`},
			// externalTrafficPolicy Local: node ports to local endpoints, unmarked.
			{"inet", "svcl-ooakdqon-a/web_http", `numgen random mod 2 0 dnat ip to 10.1.1.2:8080`},
			{"inet", "forward", `iifname "transit" oifname "gw" ct status dnat accept`},
			// Client affinity (sessionAffinity: ClientIP).
			{"inet", "svc-3amfmddj-a/web6_http", `ip6 saddr @aff-pt4zzescqfxhaybe update @aff-pt4zzescqfxhaybe { ip6 saddr timeout 10800s } meta mark set 19286 ct mark set 19286 dnat ip6 to [fd00:1::2]:8080`},
			{"inet", "svc-3amfmddj-a/web6_http", `update @aff-pt4zzescqfxhaybe { ip6 saddr timeout 10800s } meta mark set 19286 ct mark set 19286 dnat ip6 to [fd00:1::2]:8080`},
			{"inet", "forward", `iifname "gw" ip daddr 10.96.0.53 udp dport 53 counter reject with icmpx port-unreachable`},
			{"inet", "postrouting", `ct status dnat oifname "svc" masquerade`},
			{"inet", "services", `ct direction original ct mark 19286 meta mark set 19286`},
			{"inet", "prerouting", `iifname "transit" meta nfproto ipv4 meta l4proto . th dport vmap @node-ports4`},
			{"inet", "forward", `iifname "gw" oifname "transit" ip daddr 10.96.0.0/16 counter reject with icmpx admin-prohibited`},
			// The cluster DNS, on the default network: no service mark.
			{"inet", "svc-vonyfya4-kube-system/kube-dns_dns", `numgen random mod 2 0 dnat ip to 10.244.0.5:53`},
			{"inet", "forward", `iifname "transit" oifname "svc" ct status dnat accept`},
		},
		chains: map[string]string{
			"inet prerouting": "type nat hook prerouting priority -100; policy accept;",
			"inet services":   "type filter hook prerouting priority -150; policy accept;",
		},
		maps: map[string][]string{
			"inet service-ips4": {"type ipv4_addr . inet_proto . inet_service : verdict",
				`10.96.0.10 . tcp . 80 comment "service a/web:http" : jump svc-ooakdqon-a/web_http`,
				`10.96.0.10 . udp . 53 comment "service kube-system/kube-dns:dns" : jump svc-vonyfya4-kube-system/kube-dns_dns`},
			"inet service-ips6": {"type ipv6_addr . inet_proto . inet_service : verdict",
				`fd00:96::10 . tcp . 80 comment "service a/web6:http" : jump svc-3amfmddj-a/web6_http`},
			"inet node-ports6": {"type inet_proto . inet_service : verdict",
				`tcp . 30080 comment "service a/web6:http" : jump svc-3amfmddj-a/web6_http`},
		},
	}}
	for _, tc := range tests {
		t.Run(tc.role, func(t *testing.T) {
			got := listKernelRuleset(t, programInNewNS(t, tc.role, tc.tables))
			want := intendedRuleset(tc.tables)
			if g, w := got.String(), want.String(); g != w {
				t.Errorf("kernel ruleset differs from the intended one\n--- kernel (nft -j list ruleset)\n%s\n--- intended\n%s", g, w)
			}
			for _, m := range tc.must {
				if !got.has(m.family, m.chain, m.text) {
					t.Errorf("kernel lacks %s %s rule %q", m.family, m.chain, m.text)
				}
			}
			for fc, spec := range tc.chains {
				if got.Chains[fc] != spec {
					t.Errorf("kernel chain %s is {%s}, want {%s}", fc, got.Chains[fc], spec)
				}
			}
			for fm, m := range tc.maps {
				if !slices.Equal(got.Maps[fm], m) {
					t.Errorf("kernel map %s is %q, want %q", fm, got.Maps[fm], m)
				}
			}
		})
	}
}

// TestSyncTablesServiceMaps: syncTables keeps a router's service maps in
// step with the state: a family's map goes with its last service, both
// maps and every service chain go with the last service, and they come
// back; a set of kvnet's map name that kvnet did not make (another key
// type, used by a rule) is replaced with the table. After each step the
// kernel holds exactly the intended ruleset, maps and elements included.
func TestSyncTablesServiceMaps(t *testing.T) {
	testenv.NeedsRoot(t)
	n := withServiceAddrs(goldenState()).Networks[1]
	all := goldenServices()
	ns := programInNewNS(t, "maps", routerRules(n, all, nil))
	sync := func(step string, tables []nftTable) {
		t.Helper()
		if err := withNS(nl.NSPath(ns), func(fd int) error {
			conn, err := nftConn(fd)
			if err != nil {
				return err
			}
			return syncTables(conn, tables)
		}); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		got, want := listKernelRuleset(t, ns), intendedRuleset(tables)
		if g, w := got.String(), want.String(); g != w {
			t.Errorf("%s: kernel ruleset differs from the intended one\n--- kernel\n%s\n--- intended\n%s", step, g, w)
		}
	}
	sync("IPv4 services only", routerRules(n, all[:2], nil))
	sync("no services", routerRules(n, nil, nil))
	sync("services back", routerRules(n, all, nil))
	renamed := slices.Clone(all)
	renamed[0].Name = "a/web-renamed:http" // same key, another chain
	sync("service renamed", routerRules(n, renamed, nil))

	for _, cmd := range [][]string{
		{"delete", "table", "inet", tableName},
		{"add", "table", "inet", tableName},
		{"add", "set", "inet", tableName, "service-ips4", "{ type ipv4_addr; }"},
		{"add", "chain", "inet", tableName, "other"},
		{"add", "rule", "inet", tableName, "other", "ip", "daddr", "@service-ips4", "accept"},
	} {
		if out, err := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, cmd...)...).CombinedOutput(); err != nil {
			t.Fatalf("nft %s: %v: %s", cmd, err, out)
		}
	}
	sync("foreign set of the map's name", routerRules(n, all, nil))
}

// onlyChains returns the table of family in tables with only its chains
// names (and no maps or sets).
func onlyChains(tables []nftTable, family nftables.TableFamily, names ...string) []nftTable {
	for _, tb := range tables {
		if tb.family != family {
			continue
		}
		var keep []nftChain
		for _, c := range tb.chains {
			if slices.Contains(names, c.name) {
				keep = append(keep, c)
			}
		}
		return []nftTable{{family: family, chains: keep}}
	}
	return nil
}
