package controlplane

import (
	"context"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/config"
)

// kvnet's service accounts, as config/rbac and config/node/rbac.yaml ship
// them.
const (
	KvnetNamespace           = "kvnet-system"
	ControllerServiceAccount = "kvnet-controller"
	NodeServiceAccount       = "kvnet-node"
)

// InstallRBAC creates KvnetNamespace and applies the RBAC kvnet ships
// (embedded, so no checkout is needed): kvnet-controller's (config/rbac)
// and kvnet-node's (config/node/rbac.yaml; the rest of config/node is its
// DaemonSet).
func InstallRBAC(ctx context.Context, c client.Client) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: KvnetNamespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", KvnetNamespace, err)
	}
	if err := ApplyDir(ctx, c, config.RBAC, "rbac"); err != nil {
		return err
	}
	return ApplyFile(ctx, c, config.RBAC, "node/rbac.yaml")
}

// ServiceAccountConfig returns a client configuration that authenticates as
// service account namespace/name, which must exist: cp's server and CA, and
// a token from the TokenRequest API valid for ttl, as a pod's projected
// token would be. Its requests pass through the same authentication and RBAC
// as in a cluster, unlike cp.Config (system:masters).
func (cp *ControlPlane) ServiceAccountConfig(ctx context.Context, namespace, name string, ttl time.Duration) (*rest.Config, error) {
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return nil, err
	}
	seconds := int64(ttl / time.Second)
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("request a token for service account %s/%s: %w", namespace, name, err)
	}
	cfg := rest.AnonymousClientConfig(cp.Config) // no client certificate
	cfg.BearerToken = tr.Status.Token
	return cfg, nil
}
