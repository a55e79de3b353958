package controlplane

import (
	"fmt"
	"io/fs"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"kvnet.io/kvnet/config"
)

// KvnetCRDs returns the CRDs kvnet ships (embedded from config/crd/bases).
func KvnetCRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var out []*apiextensionsv1.CustomResourceDefinition
	err := fs.WalkDir(config.CRDs, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := config.CRDs.ReadFile(path)
		if err != nil {
			return err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(data, crd); err != nil {
			return fmt.Errorf("decode %s: %w", path, err)
		}
		out = append(out, crd)
		return nil
	})
	return out, err
}

// KvnetPolicies returns kvnet's admission policy manifests.
func KvnetPolicies() ([][]byte, error) {
	var out [][]byte
	err := fs.WalkDir(config.Policies, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := config.Policies.ReadFile(path)
		out = append(out, data)
		return err
	})
	return out, err
}

// KvnetConfig returns a Config with kvnet's CRDs and policies.
func KvnetConfig() (Config, error) {
	crds, err := KvnetCRDs()
	if err != nil {
		return Config{}, err
	}
	pols, err := KvnetPolicies()
	if err != nil {
		return Config{}, err
	}
	return Config{CRDs: crds, Manifests: pols}, nil
}
