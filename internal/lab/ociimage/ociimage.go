// Package ociimage assembles the lab's OCI images (the real cluster's
// images, KubeVirt's): layers on an empty base, OCI media types, for
// linux on this machine's architecture. Lab only.
package ociimage

import (
	"runtime"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// New returns an image of layers (bottom first) whose configuration is
// linux on runtime.GOARCH with working directory "/", then changed by
// configure (entrypoint, environment, labels...).
func New(layers []v1.Layer, configure func(*v1.ConfigFile)) (v1.Image, error) {
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	adds := make([]mutate.Addendum, 0, len(layers))
	for _, l := range layers {
		adds = append(adds, mutate.Addendum{Layer: l, MediaType: types.OCILayer})
	}
	img, err := mutate.Append(base, adds...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.WorkingDir = "/"
	configure(cf)
	return mutate.ConfigFile(img, cf)
}
