package inventory

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
)

// Scheme returns a scheme with every type Load reads.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, nadv1.AddToScheme, ipamclaimv1alpha1.AddToScheme, udnv1.AddToScheme, kubevirtv1.AddToScheme,
	} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// DefaultMACRange is where kvnet-controller reads the MAC pool's range by
// default (config/webhook/service.yaml).
var DefaultMACRange = types.NamespacedName{Namespace: "kvnet-system", Name: "kvnet-mac-range-config"}

// LoadOptions configures Load.
type LoadOptions struct {
	// MACRange names the MAC range ConfigMap; zero means DefaultMACRange.
	MACRange types.NamespacedName
}

// Load lists everything an Inventory holds, cluster-wide, and builds it.
// APIs that are not installed (no KubeVirt, say) read as empty; a MAC range
// ConfigMap that is missing or not readable reads as absent.
func Load(ctx context.Context, c client.Reader, opts LoadOptions) (*Inventory, error) {
	objs, err := List(ctx, c, opts)
	if err != nil {
		return nil, err
	}
	return Build(objs), nil
}

// List reads the objects Build needs, every field of Objects.
func List(ctx context.Context, c client.Reader, opts LoadOptions) (*Objects, error) {
	if opts.MACRange.Name == "" {
		opts.MACRange = DefaultMACRange
	}
	var (
		o      Objects
		nss    corev1.NamespaceList
		nads   nadv1.NetworkAttachmentDefinitionList
		udns   udnv1.UserDefinedNetworkList
		cudns  udnv1.ClusterUserDefinedNetworkList
		pods   corev1.PodList
		claims ipamclaimv1alpha1.IPAMClaimList
		vms    kubevirtv1.VirtualMachineList
		vmis   kubevirtv1.VirtualMachineInstanceList
		nodes  corev1.NodeList
	)
	for _, l := range []struct {
		what     string
		list     client.ObjectList
		optional bool
	}{
		{"namespaces", &nss, false},
		{"NetworkAttachmentDefinitions", &nads, true},
		{"UserDefinedNetworks", &udns, true},
		{"ClusterUserDefinedNetworks", &cudns, true},
		{"pods", &pods, false},
		{"IPAMClaims", &claims, true},
		{"VirtualMachines", &vms, true},
		{"VirtualMachineInstances", &vmis, true},
		// Nodes carry the host subnets of Layer3 networks: without them a
		// Layer3 pool reads as empty.
		{"nodes", &nodes, false},
	} {
		if err := c.List(ctx, l.list); err != nil {
			if l.optional && notInstalled(err) {
				continue
			}
			return nil, fmt.Errorf("list %s: %w", l.what, err)
		}
	}
	o.Namespaces, o.NADs, o.UDNs, o.CUDNs = nss.Items, nads.Items, udns.Items, cudns.Items
	o.Pods, o.Claims, o.VMs, o.VMIs = pods.Items, claims.Items, vms.Items, vmis.Items
	o.Nodes = nodes.Items
	var cm corev1.ConfigMap
	switch err := c.Get(ctx, opts.MACRange, &cm); {
	case err == nil:
		o.MACRange = &cm
	case apierrors.IsNotFound(err), apierrors.IsForbidden(err):
	default:
		return nil, fmt.Errorf("get ConfigMap %s: %w", opts.MACRange, err)
	}
	return &o, nil
}

// notInstalled reports whether err says the API is not served.
func notInstalled(err error) bool {
	return meta.IsNoMatchError(err) || apierrors.IsNotFound(err)
}
