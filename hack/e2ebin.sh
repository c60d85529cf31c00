#!/usr/bin/env bash
# Builds what `make e2e`'s node runs besides the testbin's kube-apiserver,
# etcd and kubectl (hack/testbin.sh), from the Go module proxy, once per
# machine: kubelet, kube-controller-manager and kube-scheduler of the same
# Kubernetes version, containerd with its runc shim, the reference CNI
# plugins (the primary network) and Multus' thin plugin (secondary
# networks). Prints the folder that holds them. runc is Debian's, and so is
# the older containerd the e2e also runs (containerd-1.6/), unpacked from
# Debian's package without installing it.
#
# The Kubernetes commands are built the way hack/testbin.sh builds
# kube-apiserver, in the same module graph and with its flags
# (hack/k8smodule.sh), so the packages they share come out of the same build
# cache. docs/e2e.md has the figures.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.2}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-2.4.2}
PLUGINS_VERSION=${PLUGINS_VERSION:-1.10.0}
MULTUS_VERSION=${MULTUS_VERSION:-4.2.3}
CACHE=${GALACTICTEST_E2EBIN_CACHE:-/var/cache/galactic-node/e2ebin}
OUT="$CACHE/k8s-$K8S_VERSION-containerd-$CONTAINERD_VERSION-plugins-$PLUGINS_VERSION-multus-$MULTUS_VERSION"
export PATH="$PATH:/usr/local/go/bin"
export GOFLAGS=-mod=mod
export GOWORK=off
# shellcheck source=hack/k8smodule.sh
. "$(dirname "$0")/k8smodule.sh"

want=(kubelet kube-controller-manager kube-scheduler containerd containerd-shim-runc-v2 ctr
	bridge host-local loopback multus multus-daemonset.yml
	containerd-1.6/containerd containerd-1.6/containerd-shim-runc-v2 containerd-1.6/ctr)
have_all() {
	local b
	for b in "${want[@]}"; do
		[ -e "$OUT/$b" ] || return 1
	done
}
if have_all; then
	echo "$OUT"
	exit 0
fi
mkdir -p "$OUT"
work=$(mktemp -d)
chmod 755 "$work" # apt-get download writes as _apt
trap 'rm -rf "$work"' EXIT

build_kubernetes() {
	local dir="$work/kubernetes"
	k8s_module "$dir" e2ebin/kubernetes
	# The commands' own main functions, as cmd/<name>/<name>.go has them.
	mkdir -p "$dir/kubelet" "$dir/kube-controller-manager" "$dir/kube-scheduler"
	cat >"$dir/kubelet/main.go" <<'GO'
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() { os.Exit(cli.Run(app.NewKubeletCommand(context.Background()))) }
GO
	cat >"$dir/kube-controller-manager/main.go" <<'GO'
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() { os.Exit(cli.Run(app.NewControllerManagerCommand())) }
GO
	cat >"$dir/kube-scheduler/main.go" <<'GO'
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() { os.Exit(cli.Run(app.NewSchedulerCommand())) }
GO
	k8s_build "$dir" "$OUT" kube-scheduler kube-controller-manager kubelet
}

build_containerd() {
	local m=github.com/containerd/containerd/v2 ldflags
	ldflags="-X $m/version.Version=v$CONTAINERD_VERSION -X $m/version.Package=$m"
	# No cgo: the btrfs snapshotter is left out; overlayfs is what the node uses.
	GOBIN="$OUT" CGO_ENABLED=0 go install -tags urfave_cli_no_docs -ldflags "$ldflags" \
		"$m/cmd/containerd@v$CONTAINERD_VERSION" "$m/cmd/ctr@v$CONTAINERD_VERSION"
	GOBIN="$OUT" CGO_ENABLED=0 go install -tags urfave_cli_no_docs,no_grpc -ldflags "$ldflags" \
		"$m/cmd/containerd-shim-runc-v2@v$CONTAINERD_VERSION"
}

build_plugins() {
	local p=github.com/containernetworking/plugins/plugins
	GOBIN="$OUT" CGO_ENABLED=0 go install "$p/main/bridge@v$PLUGINS_VERSION" \
		"$p/ipam/host-local@v$PLUGINS_VERSION" "$p/main/loopback@v$PLUGINS_VERSION"
}

# The proxy serves Multus v4 only under its gopkg.in path, and `go install
# …@v4` fails on the deprecation lookup: build it from its module's folder.
build_multus() {
	local m=gopkg.in/k8snetworkplumbingwg/multus-cni.v4 src
	src=$(go mod download -json "$m@v$MULTUS_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
	cp -r "$src" "$work/multus"
	chmod -R u+w "$work/multus"
	(cd "$work/multus" && rm -rf vendor &&
		CGO_ENABLED=0 go build -ldflags "-X $m/pkg/multus.version=v$MULTUS_VERSION" -o "$OUT/multus.tmp" ./cmd/multus &&
		mv "$OUT/multus.tmp" "$OUT/multus")
	# Its NetworkAttachmentDefinition CRD, which the e2e installs.
	cp "$work/multus/deployments/multus-daemonset.yml" "$OUT/multus-daemonset.yml"
}

# Debian 12's containerd (1.6), what a node of that release runs.
unpack_containerd16() {
	(cd "$work" && { apt-get download containerd >&2 || { apt-get update -qq && apt-get download containerd >&2; }; })
	dpkg-deb -x "$work"/containerd_*.deb "$work/containerd16"
	mkdir -p "$OUT/containerd-1.6.tmp"
	cp "$work/containerd16/usr/bin/containerd" "$work/containerd16/usr/bin/containerd-shim-runc-v2" \
		"$work/containerd16/usr/bin/ctr" "$OUT/containerd-1.6.tmp/"
	dpkg-deb -f "$work"/containerd_*.deb Version >"$OUT/containerd-1.6.tmp/VERSION"
	# The e2e names this runtime 1.6: refuse another release's containerd.
	grep -q '^1\.6\.' "$OUT/containerd-1.6.tmp/VERSION" || {
		echo "e2ebin: Debian's containerd is $(cat "$OUT/containerd-1.6.tmp/VERSION"), not 1.6" >&2
		exit 1
	}
	rm -rf "$OUT/containerd-1.6"
	mv "$OUT/containerd-1.6.tmp" "$OUT/containerd-1.6"
}

[ -x "$OUT/kubelet" ] && [ -x "$OUT/kube-controller-manager" ] && [ -x "$OUT/kube-scheduler" ] || build_kubernetes >&2
[ -x "$OUT/containerd" ] && [ -x "$OUT/containerd-shim-runc-v2" ] && [ -x "$OUT/ctr" ] || build_containerd >&2
[ -x "$OUT/bridge" ] && [ -x "$OUT/host-local" ] && [ -x "$OUT/loopback" ] || build_plugins >&2
[ -x "$OUT/multus" ] && [ -f "$OUT/multus-daemonset.yml" ] || build_multus >&2
[ -x "$OUT/containerd-1.6/containerd" ] || unpack_containerd16 >&2
echo "$OUT"
