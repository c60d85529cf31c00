// Package layout holds the tests of which way imports run between the
// repository's packages: that the core of the node (the reclaim, the link
// layer, the teardown) and the CNI plugin link no Kubernetes client and no
// Prometheus client, and that the eBPF datapath depends on nothing of the
// node. A package that the README's Layout table says knows nothing of X
// must keep knowing nothing of it.
package layout
