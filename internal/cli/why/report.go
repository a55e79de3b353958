package why

import (
	"fmt"
	"io"
	"strings"
)

// Code is the stable short name of a broken link. Scripts may match on it;
// the sentence that comes with it may change.
type Code string

// The broken links kvnet why names, in the order of the chain.
const (
	// NamespaceNotLabelled: something in the namespace expects a primary
	// UDN, but the namespace lacks the label (it cannot be added later).
	NamespaceNotLabelled Code = "NamespaceNotLabelled"
	// NoPrimaryNetwork: a labelled namespace with no primary UDN, CUDN or NAD.
	NoPrimaryNetwork Code = "NoPrimaryNetwork"
	// PrimaryNetworkNotRendered: the primary UDN/CUDN exists, its NAD does
	// not (not rendered yet, or NetworkCreated=False).
	PrimaryNetworkNotRendered Code = "PrimaryNetworkNotRendered"
	// NADNotFound: a network-selection element (or a VM network) names a
	// NAD that does not exist.
	NADNotFound Code = "NADNotFound"
	// NADUnservedType: the NAD's CNI type is one kvnet does not serve and
	// nothing else in a kvnet cluster does (OVN-Kubernetes' type).
	NADUnservedType Code = "NADUnservedType"
	// NADInvalid: a kvnet NAD whose configuration does not parse.
	NADInvalid Code = "NADInvalid"
	// NADConfigMismatch: a hand-written NAD that names a network an
	// earlier NAD defines differently; kvnet-controller refused it
	// (kvnet.io/network-conflict).
	NADConfigMismatch Code = "NADConfigMismatch"
	// InvalidNetworkRequest: the pod's network annotations cannot be served
	// as written.
	InvalidNetworkRequest Code = "InvalidNetworkRequest"
	// BindingNotRegistered: a VM interface names a binding plugin the
	// KubeVirt CR does not register.
	BindingNotRegistered Code = "BindingNotRegistered"
	// BindingUnsupported: a binding that cannot work on its network.
	BindingUnsupported Code = "BindingUnsupported"
	// WebhookNotRegistered: kvnet's MutatingWebhookConfiguration (or one
	// of its webhooks) is missing.
	WebhookNotRegistered Code = "WebhookNotRegistered"
	// WebhookCertMissing: the Secret with kvnet's serving certificate is
	// missing or unreadable.
	WebhookCertMissing Code = "WebhookCertMissing"
	// WebhookCABundleMismatch: a webhook's caBundle does not verify the
	// certificate kvnet serves.
	WebhookCABundleMismatch Code = "WebhookCABundleMismatch"
	// WebhookServiceMissing: the webhook's Service does not exist.
	WebhookServiceMissing Code = "WebhookServiceMissing"
	// WebhookNoEndpoints: the webhook's Service has no ready endpoint.
	WebhookNoEndpoints Code = "WebhookNoEndpoints"
	// ClaimNotFound: a referenced (or, for a VM, needed) IPAMClaim is missing.
	ClaimNotFound Code = "ClaimNotFound"
	// ClaimOwnedByOther: the claim belongs to another VM or pod.
	ClaimOwnedByOther Code = "ClaimOwnedByOther"
	// ClaimWrongNetwork: the claim's spec.network is another network.
	ClaimWrongNetwork Code = "ClaimWrongNetwork"
	// ClaimIgnored: a claim reference on a network without persistent IPs.
	ClaimIgnored Code = "ClaimIgnored"
	// NADSelectedTwice: two networks of a VM select the same kvnet NAD.
	NADSelectedTwice Code = "NADSelectedTwice"
	// ClaimNameUnusable: a VM's networks compose an IPAMClaim name twice,
	// or one that is no valid object name.
	ClaimNameUnusable Code = "ClaimNameUnusable"
	// ClaimReferenceMissing: a VM's launcher pod lacks the claim
	// reference kvnet's webhook adds.
	ClaimReferenceMissing Code = "ClaimReferenceMissing"
	// LauncherPodMissing: a VMI without a virt-launcher pod.
	LauncherPodMissing Code = "LauncherPodMissing"
	// PoolExhausted: the network has no free address for the pod.
	PoolExhausted Code = "PoolExhausted"
	// AllocationFailed: kvnet-controller could not allocate, for another
	// reason than exhaustion.
	AllocationFailed Code = "AllocationFailed"
	// AnnotationInvalid: the pod's kvnet.io/pod-networks does not parse.
	AnnotationInvalid Code = "AnnotationInvalid"
	// WaitingForController: the pod has no addresses yet and nothing says why.
	WaitingForController Code = "WaitingForController"
	// NodeNotFound: the pod's node does not exist.
	NodeNotFound Code = "NodeNotFound"
	// KvnetNodeMissing: no kvnet-node runs on the pod's node.
	KvnetNodeMissing Code = "KvnetNodeMissing"
	// KvnetNodeNotReady: the kvnet-node pod on the pod's node is not Ready.
	KvnetNodeNotReady Code = "KvnetNodeNotReady"
	// MigrationFailed: the VMI's last live migration failed.
	MigrationFailed Code = "MigrationFailed"
	// GuestAddressMissing: the VMI reports an interface's addresses (from
	// the guest agent) and an address the interface's IPAMClaim holds is
	// not among them.
	GuestAddressMissing Code = "GuestAddressMissing"
)

// Problem is the first broken link of a chain.
type Problem struct {
	Code    Code
	Message string // what is wrong, in a sentence or two
	Fix     string // what to do
}

// Link is one checked link of the chain.
type Link struct {
	Kind   string // "namespace", "network", "NAD", "claim", ...
	Detail string
	Broken bool
}

// Report is the outcome of walking an object's chain.
type Report struct {
	Subject string // "pod ns/name", "vm ns/name"
	Links   []Link
	Problem *Problem // nil: healthy
	Summary string   // one line for a healthy chain
}

// Healthy reports whether no link is broken.
func (r *Report) Healthy() bool { return r.Problem == nil }

func (r *Report) ok(kind, format string, args ...any) {
	r.Links = append(r.Links, Link{Kind: kind, Detail: fmt.Sprintf(format, args...)})
}

// fail records the broken link and the problem; it returns true so that
// checks can "return r.fail(...)".
func (r *Report) fail(kind, detail string, code Code, fix, format string, args ...any) bool {
	r.Links = append(r.Links, Link{Kind: kind, Detail: detail, Broken: true})
	r.Problem = &Problem{Code: code, Message: fmt.Sprintf(format, args...), Fix: fix}
	return true
}

// Print writes the report: the verdict first, then the chain.
func (r *Report) Print(w io.Writer) {
	if r.Problem == nil {
		fmt.Fprintf(w, "%s: healthy: %s\n", r.Subject, r.Summary)
	} else {
		fmt.Fprintf(w, "%s: %s: %s\n", r.Subject, r.Problem.Code, r.Problem.Message)
		if r.Problem.Fix != "" {
			fmt.Fprintf(w, "  fix: %s\n", r.Problem.Fix)
		}
	}
	width := 0
	for _, l := range r.Links {
		width = max(width, len(l.Kind))
	}
	for _, l := range r.Links {
		mark := "ok"
		if l.Broken {
			mark = "!!"
		}
		fmt.Fprintf(w, "  %s %-*s  %s\n", mark, width, l.Kind, strings.TrimSpace(l.Detail))
	}
}
