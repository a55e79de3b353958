package lab

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/audit"
	"kvnet.io/kvnet/internal/inventory"
)

// SeenDuplicate is a duplicate IP or MAC an audit snapshot taken during
// the run found.
type SeenDuplicate struct {
	// At is when it was first seen, since the operations started; Last
	// when it was last seen; Snapshots in how many snapshots.
	At        string `json:"at"`
	Last      string `json:"last"`
	Snapshots int    `json:"snapshots"`
	audit.Finding
}

func (d SeenDuplicate) String() string {
	when := "at +" + d.At
	if d.Snapshots > 1 {
		when = fmt.Sprintf("from +%s to +%s, in %d snapshots", d.At, d.Last, d.Snapshots)
	}
	return fmt.Sprintf("%s %s %s: %s (seen %s)", d.Kind, d.Network, d.Object, d.Detail, when)
}

// duplicateKinds are the audit findings a snapshot during the churn
// reports: those that are wrong at any moment. Others (a leaked claim, a
// pod not matching its claim yet) are normal while controllers catch up,
// and the audit after settling reports them.
var duplicateKinds = map[string]bool{audit.DuplicateIP: true, audit.DuplicateMAC: true, audit.DuplicateVMMAC: true}

// snapshots audits the cluster every interval until stop is closed, and
// records the duplicates it sees.
type snapshots struct {
	mu     sync.Mutex
	taken  int
	failed int
	seen   map[string]*SeenDuplicate
	order  []string
}

// atRevision reads every list at one resourceVersion (resourceVersionMatch
// Exact), so that the lists of one audit snapshot are one moment of the
// cluster: listed one after the other at their latest, a claim released
// and its IP given to a new pod in between would read as a duplicate that
// never was.
type atRevision struct {
	client.Reader
	rv string
}

func (r atRevision) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	raw := &metav1.ListOptions{ResourceVersion: r.rv, ResourceVersionMatch: metav1.ResourceVersionMatchExact}
	return r.Reader.List(ctx, list, append(opts, &client.ListOptions{Raw: raw})...)
}

// snapshotDuplicates audits the cluster as it is at one moment and returns
// the duplicate findings.
func snapshotDuplicates(ctx context.Context, c client.Reader) ([]audit.Finding, error) {
	// The current revision: a list's resourceVersion (read from etcd).
	var nss corev1.NamespaceList
	if err := c.List(ctx, &nss, client.Limit(1)); err != nil {
		return nil, err
	}
	objs, err := inventory.List(ctx, atRevision{Reader: c, rv: nss.ResourceVersion}, inventory.LoadOptions{})
	if err != nil {
		return nil, err
	}
	var out []audit.Finding
	for _, f := range audit.Check(inventory.Build(objs)).Findings {
		if duplicateKinds[f.Kind] {
			out = append(out, f)
		}
	}
	return out, nil
}

func (s *snapshots) run(ctx context.Context, c client.Reader, start time.Time, every time.Duration, stop <-chan struct{}) {
	s.mu.Lock()
	s.seen = map[string]*SeenDuplicate{}
	s.mu.Unlock()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fs, err := snapshotDuplicates(ctx, c)
		at := time.Since(start).Round(time.Millisecond).String()
		s.mu.Lock()
		if err != nil {
			// The API server restarting, say: the next one will do.
			s.failed++
			s.mu.Unlock()
			continue
		}
		s.taken++
		for _, f := range fs {
			k := f.Kind + " " + f.Network + " " + f.Object + " " + f.Detail
			d := s.seen[k]
			if d == nil {
				d = &SeenDuplicate{At: at, Finding: f}
				s.seen[k] = d
				s.order = append(s.order, k)
			}
			d.Last = at
			d.Snapshots++
		}
		s.mu.Unlock()
	}
}

// result returns how many snapshots were taken and failed, and the
// duplicates seen, in the order first seen.
func (s *snapshots) result() (taken, failed int, seen []SeenDuplicate) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen = []SeenDuplicate{}
	for _, k := range s.order {
		seen = append(seen, *s.seen[k])
	}
	return s.taken, s.failed, seen
}
