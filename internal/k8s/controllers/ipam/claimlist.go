package ipam

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
)

// heldClaim is what the rebuild needs of an IPAMClaim holding IPs.
type heldClaim struct {
	key     types.NamespacedName
	network string
	ips     []netip.Addr
}

// claimLister reads every IPAMClaim that holds IPs, passing them to emit
// in batches as they arrive. Only a nil error means all were passed.
type claimLister interface {
	listHeld(ctx context.Context, emit func([]heldClaim)) (resourceVersion string, err error)
}

// restClaimLister lists IPAMClaims with consistent, large-page requests
// and decodes each response as it streams in.
//
// Consistent: the first page has no resourceVersion, so the list includes
// every write made before it (the previous controller's last claim status
// included); the other pages continue at its resourceVersion. The API
// server serves such lists from its watch cache once that has caught up
// with etcd (ConsistentListFromCache, GA in Kubernetes 1.34; pages from
// cache snapshots, ListFromCacheSnapshot, beta and on since 1.34), so they
// cost no etcd range reads. resourceVersion=0 would not wait for the
// cache to catch up: it may be served by a watch cache lagging behind
// etcd, and an IP written just before the restart could be handed out
// again.
//
// Large pages: the API server serializes a response in one goroutine, so
// fewer, larger requests waste least; a page still bounds what one
// response holds and how long it takes (well under the API server's
// request timeout at any cluster size).
//
// Uncompressed: gzip costs CPU on both ends, in the API server's
// serializing goroutine too, and at start-up CPU is the scarce resource.
type restClaimLister struct {
	rest rest.Interface
	// pageSize limits each request to that many claims; 0 lists all in
	// one request.
	pageSize int64
}

// claimPageSize is the page size of the rebuild's claim list: 100,000
// claims in ten requests (measured no slower than one request).
const claimPageSize = 10000

func newRESTClaimLister(config *rest.Config, scheme *runtime.Scheme, pageSize int64) (*restClaimLister, error) {
	cfg := rest.CopyConfig(config)
	gv := ipamclaimv1alpha1.GroupVersion
	cfg.GroupVersion = &gv
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	cfg.DisableCompression = true
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("IPAMClaim REST client: %w", err)
	}
	return &restClaimLister{rest: rc, pageSize: pageSize}, nil
}

func (l *restClaimLister) listHeld(ctx context.Context, emit func([]heldClaim)) (string, error) {
	for attempt := 1; ; attempt++ {
		rv, err := l.list(ctx, emit)
		// A continue token can expire (410) in a very long list; start
		// over. Emitting a claim twice is harmless: reserving the same IPs
		// for the same claim again is a no-op.
		if apierrors.IsResourceExpired(err) && attempt < 3 {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("list IPAMClaims: %w", err)
		}
		return rv, nil
	}
}

func (l *restClaimLister) list(ctx context.Context, emit func([]heldClaim)) (string, error) {
	var rv string
	for cont := ""; ; {
		meta, err := l.page(ctx, cont, emit)
		if err != nil {
			return "", err
		}
		if rv == "" {
			rv = meta.resourceVersion
		}
		if cont = meta.continueToken; cont == "" {
			return rv, nil
		}
	}
}

func (l *restClaimLister) page(ctx context.Context, cont string, emit func([]heldClaim)) (listMeta, error) {
	req := l.rest.Get().Resource("ipamclaims").SetHeader("Accept", "application/json")
	if l.pageSize > 0 {
		req = req.Param("limit", strconv.FormatInt(l.pageSize, 10))
	}
	if cont != "" {
		req = req.Param("continue", cont)
	}
	body, err := req.Stream(ctx)
	if err != nil {
		return listMeta{}, err
	}
	defer body.Close()
	return decodeHeldClaims(body, emit)
}
