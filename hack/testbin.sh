#!/usr/bin/env bash
# Builds the real kube-apiserver and etcd that the cluster tests run against,
# and the kubectl that runs the docs' install steps against them, from the Go
# module proxy, once per machine. Prints the folder that holds
# them (for KUBEBUILDER_ASSETS). Cached outside the work tree; README.md
# ("Tests and benchmarks") has the cold build's time.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.2}
ETCD_VERSION=${ETCD_VERSION:-3.6.16}
CACHE=${GALACTICTEST_TESTBIN_CACHE:-/var/cache/galactic-node/testbin}
OUT="$CACHE/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"
export PATH="$PATH:/usr/local/go/bin"
export GOFLAGS=-mod=mod
export GOWORK=off
# shellcheck source=hack/k8smodule.sh
. "$(dirname "$0")/k8smodule.sh"

if [ -x "$OUT/kube-apiserver" ] && [ -x "$OUT/etcd" ] && [ -x "$OUT/kubectl" ]; then
	echo "$OUT"
	exit 0
fi
mkdir -p "$OUT"
work=$(mktemp -d)
# Under set -e a failing kill (no job left) would end the trap, and the
# script, with its status.
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

build_etcd() {
	local dir="$work/etcd"
	mkdir -p "$dir"
	cat >"$dir/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
	(cd "$dir" && go mod init testbin/etcd >/dev/null 2>&1 &&
		go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >&2 &&
		go mod tidy >&2 &&
		go build -o "$OUT/etcd.tmp" . && mv "$OUT/etcd.tmp" "$OUT/etcd")
}

# kube-apiserver and kubectl in one go build of one module (hack/k8smodule.sh):
# kubectl's client packages are the API server's, compiled once.
build_kubernetes() {
	local dir="$work/kubernetes"
	k8s_module "$dir" testbin/kubernetes
	mkdir -p "$dir/kube-apiserver" "$dir/kubectl"
	# The commands' own main functions, as cmd/<name>/<name>.go has them.
	cat >"$dir/kube-apiserver/main.go" <<'GO'
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() { os.Exit(cli.Run(app.NewAPIServerCommand())) }
GO
	cat >"$dir/kubectl/main.go" <<'GO'
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		util.CheckErr(err)
	}
}
GO
	k8s_build "$dir" "$OUT" kube-apiserver kubectl
}

# etcd builds beside them: each build leaves a core idle while it
# downloads modules and while it links.
etcd=
if [ ! -x "$OUT/etcd" ]; then
	build_etcd >&2 &
	etcd=$!
fi
if [ ! -x "$OUT/kube-apiserver" ] || [ ! -x "$OUT/kubectl" ]; then
	build_kubernetes >&2
fi
if [ -n "$etcd" ] && ! wait "$etcd"; then
	echo "testbin: building etcd failed" >&2
	exit 1
fi
echo "$OUT"
