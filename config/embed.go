// Package config embeds the manifests kvnet installs itself: the CRDs,
// admission policies, webhook configuration and RBAC. The lab applies them from here, so the kvnet binary
// needs no checkout; a cluster applies the same files with kustomize.
package config

import "embed"

// CRDs holds crd/bases/*.yaml.
//
//go:embed crd/bases/*.yaml
var CRDs embed.FS

// Policies holds policy/*.yaml (ValidatingAdmissionPolicies).
//
//go:embed policy/namespace-label.yaml
var Policies embed.FS

// Webhooks holds webhook/webhooks.yaml (the MutatingWebhookConfiguration).
//
//go:embed webhook/webhooks.yaml
var Webhooks []byte

// RBAC holds rbac/*.yaml (kvnet-controller's service account and roles)
// and node/rbac.yaml (kvnet-node's), which the lab runs the components as.
//
//go:embed rbac/*.yaml node/rbac.yaml
var RBAC embed.FS

// Tree holds every kustomize directory, for `kvnet install`, which renders
// default/ with the images the user names, and monitoring/ with
// --monitoring.
//
//go:embed default crd manager node policy rbac webhook monitoring/*.yaml
var Tree embed.FS
