package cluster

// The parsing and statistics of BenchmarkClusterPodReady
// (bench_privileged_test.go), without the build tag so that plain go
// test checks them.

import (
	"bufio"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// multusAdd is one CNI ADD multus-daemon served: from its "ADD starting
// CNI request" line to its "ADD finished CNI request" line, with the
// delegates it ran in between ("Add: <ns>:<pod>:<uid>:<network>(<CNI
// configuration name>):<ifname> <result>" lines, in order).
type multusAdd struct {
	container  string
	uid        types.UID
	start, end time.Time
	ok         bool // finished with err: <nil>
	delegates  []multusDelegate
}

type multusDelegate struct {
	network, conf, ifName string
	end                   time.Time
}

var (
	multusStartRE    = regexp.MustCompile(`\[verbose\] ADD starting CNI request ContainerID:"([^"]*)".* Args:"([^"]*)"`)
	multusFinishedRE = regexp.MustCompile(`\[verbose\] ADD finished CNI request ContainerID:"([^"]*)"`)
	multusDelegateRE = regexp.MustCompile(`\[verbose\] Add: [^:]*:[^:]*:([^:]*):(.*?)\(([^()]*)\):(\S+) `)
	podUIDArgRE      = regexp.MustCompile(`(?:^|;)K8S_POD_UID=([^;]*)`)
)

// parseMultusLog adds the ADDs of one multus-daemon log (lines of
// "<RFC 3339 timestamp> <multus line>") to adds. Delegate lines go to the
// pod's ADD in progress at their time.
func parseMultusLog(log string, adds map[types.UID][]*multusAdd) error {
	byContainer := map[string]*multusAdd{}
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		stamp, line, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, stamp)
		if err != nil {
			return fmt.Errorf("line %q: timestamp: %w", sc.Text(), err)
		}
		if m := multusStartRE.FindStringSubmatch(line); m != nil {
			u := podUIDArgRE.FindStringSubmatch(m[2])
			if u == nil {
				continue // not a pod's ADD
			}
			a := &multusAdd{container: m[1], uid: types.UID(u[1]), start: t}
			byContainer[a.container] = a
			adds[a.uid] = append(adds[a.uid], a)
			continue
		}
		if m := multusFinishedRE.FindStringSubmatch(line); m != nil {
			if a := byContainer[m[1]]; a != nil {
				a.end, a.ok = t, strings.HasSuffix(line, "err: <nil>")
			}
			continue
		}
		if m := multusDelegateRE.FindStringSubmatch(line); m != nil {
			uid := types.UID(m[1])
			for _, a := range slices.Backward(adds[uid]) {
				if !t.Before(a.start) && a.end.IsZero() {
					a.delegates = append(a.delegates, multusDelegate{network: m[2], conf: m[3], ifName: m[4], end: t})
					break
				}
			}
		}
	}
	return sc.Err()
}

// successfulAdd is the last ADD of the pod with uid that finished
// without error; pod (namespace/name) names it in the error.
func successfulAdd(adds map[types.UID][]*multusAdd, pod string, uid types.UID) (*multusAdd, error) {
	for _, a := range slices.Backward(adds[uid]) {
		if a.ok {
			return a, nil
		}
	}
	return nil, fmt.Errorf("pod %s (uid %s): no successful ADD in the multus-daemon logs (%d ADD(s) started); are multus-daemon's verbose lines on (logLevel verbose in multus-daemon-config)?",
		pod, uid, len(adds[uid]))
}

// delegateTime is how long the delegates whose CNI configuration name
// is in confs took within a, in all: each from the previous mark (the
// end of the delegate before it, or the start of the request for the
// first) to its own line. ok is false when a ran none of them.
func delegateTime(a *multusAdd, confs map[string]bool) (d time.Duration, ok bool) {
	prev := a.start
	for _, del := range a.delegates {
		if confs[del.conf] {
			d, ok = d+del.end.Sub(prev), true
		}
		prev = del.end
	}
	return d, ok
}

// percentile is the nearest-rank p-th percentile of xs (p99 of 20 samples
// is the largest).
func percentile[T time.Duration | float64](xs []T, p float64) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(i, 0)]
}
