// Package e2e runs kvnet end to end the way its README does: the kvnet
// binary, the lab, the demo.
package e2e
