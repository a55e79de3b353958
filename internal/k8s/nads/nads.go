// Package nads reads NetworkAttachmentDefinitions the way every kvnet
// controller and webhook needs them: the served configuration of a NAD by
// key, and a namespace's primary network NAD.
package nads

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/udn"
)

// Lookup returns the served configuration of NAD "<ns>/<name>": found is
// false when it does not exist; s is nil when kvnet does not serve it. A
// configuration kvnet cannot parse, or a NAD refused because it disagrees
// with an earlier NAD of its network (udn.NetworkConflictAnnotation), is
// returned as err.
func Lookup(ctx context.Context, c client.Reader, key string) (s *netconf.Served, found bool, err error) {
	ns, name, _ := strings.Cut(key, "/")
	var nad nadv1.NetworkAttachmentDefinition
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &nad); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, false, nil
		}
		return nil, false, err
	}
	if msg, ok := nad.Annotations[udn.NetworkConflictAnnotation]; ok {
		return nil, true, fmt.Errorf("%w: %s", netconf.ErrInvalid, msg)
	}
	s, err = netconf.ParseServed(nad.Spec.Config)
	return s, true, err
}

// Primary returns whether namespace carries the primary-network label and
// the key of its primary NAD ("" when none).
func Primary(ctx context.Context, c client.Reader, namespace string) (labelled bool, key string, err error) {
	var ns corev1.Namespace
	if err := c.Get(ctx, client.ObjectKey{Name: namespace}, &ns); err != nil {
		return false, "", err
	}
	if _, ok := ns.Labels[udn.PrimaryNamespaceLabel]; !ok {
		return false, "", nil
	}
	var list nadv1.NetworkAttachmentDefinitionList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return true, "", err
	}
	for i := range list.Items {
		nad := &list.Items[i]
		if nad.DeletionTimestamp != nil {
			continue
		}
		if s, err := netconf.ParseServed(nad.Spec.Config); err == nil && s != nil && s.IsPrimary() {
			return true, namespace + "/" + nad.Name, nil
		}
	}
	return true, "", nil
}
