package node

import (
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"kvnet.io/kvnet/internal/datapath"
)

// RefusePolicyRules makes the datapath check kvnet-node runs on a
// network's policies (failClosed) refuse every state holding a rule
// whose name is in the list set by the returned function, as if the
// datapath could not program it, until the test ends. Call it before the
// test's agents start: they read the seam while they run.
func RefusePolicyRules(t testing.TB) (set func(names ...string)) {
	t.Helper()
	var refused atomic.Pointer[[]string]
	refused.Store(&[]string{})
	orig := validatePolicies
	validatePolicies = func(s datapath.State) error {
		names := *refused.Load()
		for _, pp := range s.Policies {
			for _, d := range []*datapath.PolicyDirection{pp.Ingress, pp.Egress} {
				if d != nil && slices.ContainsFunc(d.Rules, func(r datapath.PolicyRule) bool { return slices.Contains(names, r.Name) }) {
					return errors.New("refused by the test")
				}
			}
		}
		return orig(s)
	}
	t.Cleanup(func() { validatePolicies = orig })
	return func(names ...string) { refused.Store(&names) }
}

// SetScopeGrace sets how long an unneeded network's pods stay watched
// (PodScopeNetworks) until the test ends. Call it before the test's
// agents start.
func SetScopeGrace(t testing.TB, d time.Duration) {
	orig := scopeGrace
	scopeGrace = d
	t.Cleanup(func() { scopeGrace = orig })
}

// CacheOptionsForTest are kvnet-node's informer cache options, with its
// scheme, for a node caching every pod (PodScopeCluster).
func CacheOptionsForTest(clusterDNS types.NamespacedName) (cache.Options, error) {
	s, err := newScheme()
	if err != nil {
		return cache.Options{}, err
	}
	o := cacheOptions(cache.ByObject{Transform: trimPod}, clusterDNS)
	o.Scheme = s
	return o, nil
}
