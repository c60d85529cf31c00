// Package e2e runs galactic on a real Kubernetes node, built offline and
// started by the tests themselves: the testbin's kube-apiserver and etcd,
// kube-controller-manager, kube-scheduler and a kubelet of the same
// version, containerd with runc, the reference CNI plugins as the primary
// network and Multus' thin plugin for secondary ones. The node lives in
// namespaces of its own (network, mount, a cgroup subtree, a bpffs) and
// leaves the host's kernel settings, folders and links as it found them.
//
// `make e2e` builds the parts (hack/e2ebin.sh, hack/testbin.sh, make
// images) and runs it; docs/e2e.md says what the node is made of and why.
package e2e
