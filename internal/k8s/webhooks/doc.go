// Package webhooks holds kvnet's admission webhooks: the virt-launcher pod
// mutator that points pods at their VM's IPAMClaims, and the VirtualMachine
// mutator that gives VM interfaces unique MACs from the MAC pool.
//
// Both use failurePolicy Fail: admitting a launcher pod without its claim
// reference would silently give a VM a new IP, and admitting a VM without a
// pool MAC could duplicate a MAC; failing the request is the safer error,
// and KubeVirt retries.
package webhooks
