// Package udn turns UserDefinedNetworks and ClusterUserDefinedNetworks into
// NetworkAttachmentDefinitions: network naming, CNI configuration rendering,
// the desired NAD object, network-ID allocation and the "network in use"
// check. It holds no Kubernetes client; internal/k8s/controllers/udn feeds
// it objects and applies what it returns.
package udn
