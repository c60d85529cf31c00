// Package integration holds privileged end-to-end tests: the built
// galactic-node binary in a network namespace of its own, against a real
// kube-apiserver and etcd, driven over its admin API as an operator would.
package integration
