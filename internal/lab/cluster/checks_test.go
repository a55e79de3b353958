package cluster

// Checks of the real-cluster test (the cluster build tag) that read
// what the cluster reports (kubelet probe metrics, containerd's version,
// host-local leases, kvnet-cni's collection status), and the recap of its
// failures, without the build tag so that plain go test checks them.

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// probeCounts sums the kubelet's prober_probe_total of pod ns/name and
// probe type (Liveness, Readiness) by result (successful, failed,
// unknown) from the text of its /metrics/probes.
func probeCounts(metrics, ns, name, probeType string) (map[string]int, error) {
	counts := map[string]int{}
	for _, l := range strings.Split(metrics, "\n") {
		if !strings.HasPrefix(l, "prober_probe_total{") {
			continue
		}
		labelText, value, ok := strings.Cut(strings.TrimPrefix(l, "prober_probe_total{"), "} ")
		if !ok {
			return nil, fmt.Errorf("prober_probe_total line %q: no value", l)
		}
		labels := map[string]string{}
		for _, kv := range strings.Split(labelText, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				continue
			}
			if uq, err := strconv.Unquote(v); err == nil {
				v = uq
			}
			labels[k] = v
		}
		if labels["namespace"] != ns || labels["pod"] != name || labels["probe_type"] != probeType {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("prober_probe_total line %q: %w", l, err)
		}
		counts[labels["result"]] += int(v)
	}
	return counts, nil
}

// probesVerdict judges a pod's liveness probe counts: at least
// minPasses successful ones and not one that failed or whose result
// was unknown (a timeout, a refused connection, an error of the
// prober). nil when the probes held.
func probesVerdict(counts map[string]int, minPasses int) error {
	bad := 0
	for r, n := range counts {
		if r != "successful" {
			bad += n
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d liveness probes did not succeed (%d failed, %d unknown; %d successful)", bad, counts["failed"], counts["unknown"], counts["successful"])
	}
	if n := counts["successful"]; n < minPasses {
		return fmt.Errorf("%d successful liveness probes so far, want %d", n, minPasses)
	}
	return nil
}

// containerdVersion returns the version containerd --version prints
// ("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1"
// gives 1.6.20~ds1): what its CRI reports to the kubelet as
// containerd://<version>.
func containerdVersion(out string) (string, error) {
	f := strings.Fields(out)
	if len(f) < 3 || f[0] != "containerd" {
		return "", fmt.Errorf("containerd --version: %q: want \"containerd <module> <version> [<revision>]\"", strings.TrimSpace(out))
	}
	return f[2], nil
}

// checkRuntimeVersion checks a node's status.nodeInfo.containerRuntimeVersion:
// exactly containerd://<version> of the containerd binary the nodes run
// (containerd --version on the host, or its upstream part before Debian's
// ~ or + suffix, which is what the CRI reports), and that version the documented
// upstream release (docs/cluster.md: 1.6.20, Debian's suffix after ~,
// - or + allowed).
func checkRuntimeVersion(reported, binary, documented string) error {
	// The CRI reports the version compiled in, without the packaging
	// suffix Debian's --version adds (seen: "1.6.20" for "1.6.20~ds1").
	upstream, _, _ := strings.Cut(binary, "~")
	upstream, _, _ = strings.Cut(upstream, "+")
	if want := "containerd://" + binary; reported != want && reported != "containerd://"+upstream {
		return fmt.Errorf("containerRuntimeVersion %q, want %q (the host's containerd --version, or its upstream part %q)", reported, want, upstream)
	}
	rest, ok := strings.CutPrefix(binary, documented)
	if !ok || (rest != "" && !strings.ContainsAny(rest[:1], "~-+")) {
		return fmt.Errorf("containerd %s is not the documented %s", binary, documented)
	}
	return nil
}

// leaseContainer returns the container ID a host-local lease file holds
// (its first line; the second, from CNI 0.4 on, is the interface).
func leaseContainer(content string) (string, error) {
	id, _, _ := strings.Cut(strings.TrimSpace(content), "\n")
	id = strings.TrimSpace(id)
	if id == "" {
		return "", fmt.Errorf("host-local lease %q: no container ID", content)
	}
	return id, nil
}

// cniGCStatus is what the real-cluster test reads of kvnet-cni's
// gc-status.json on a node (internal/cni, keptgc.go).
type cniGCStatus struct {
	Collected   int      `json:"collected"`
	Failures    int      `json:"failures"`
	LastFailure string   `json:"lastFailure"`
	Pending     []string `json:"pending"`
}

// parseCNIGCStatus reads gc-status.json; an absent file (nothing
// collected on the node yet) is the zero status.
func parseCNIGCStatus(b []byte, exists bool) (cniGCStatus, error) {
	var s cniGCStatus
	if !exists {
		return s, nil
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("gc-status.json %q: %w", b, err)
	}
	return s, nil
}

// lostDel is a primary-UDN pod's default-network lease still held on
// its node after the pod went: the runtime's CNI DEL did not reach
// kvnet-cni for its sandbox (kvnet-cni's kept record of the sandbox is
// still there).
type lostDel struct {
	node, ip, container string
}

// collectedVerdict judges kvnet-cni's collection of the lost DELs on
// one node: after a kvnet-cni call there, each lease must be released
// and its kept record gone, and none of them pending. (gc-status.json's
// count is not required to grow: on the real cluster a DEL that was only
// late released the lease without a collection.)
func collectedVerdict(lost []lostDel, after cniGCStatus, held func(lostDel) bool, kept func(lostDel) bool) error {
	var errs []string
	for _, l := range lost {
		if held(l) {
			errs = append(errs, fmt.Sprintf("lease of %s (container %s) still held", l.ip, l.container))
		}
		if kept(l) {
			errs = append(errs, fmt.Sprintf("kvnet-cni's kept record of container %s still there", l.container))
		}
		for _, p := range after.Pending {
			if p == l.container {
				errs = append(errs, fmt.Sprintf("container %s pending collection (last failure %q)", l.container, after.LastFailure))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// allPending reports whether gc-status.json after lists every container
// of lost as pending: tracked, tried again by the next call.
func allPending(lost []lostDel, after cniGCStatus) bool {
	for _, l := range lost {
		if !slices.Contains(after.Pending, l.container) {
			return false
		}
	}
	return true
}

// recapText is the recap of a failed cluster test, for the end of its
// output, of which CI shows about the last 2,000 characters: each
// failure in a line of at most 160 characters, then the first one (the
// likeliest cause of the others) again in full (500 at most), last.
func recapText(failed []string) string {
	if len(failed) == 1 {
		return failed[0]
	}
	var b strings.Builder
	for _, l := range failed {
		if len(l) > 160 {
			l = l[:160] + "..."
		}
		b.WriteString(l + "\n")
	}
	b.WriteString("the first failure in full: " + failed[0])
	return b.String()
}
