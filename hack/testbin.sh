#!/usr/bin/env bash
# Builds the real kube-apiserver and etcd that the cluster tests run against,
# and the kubectl that runs the docs' install steps against them, from the Go
# module proxy, once per machine. Prints the folder that holds
# them (for KUBEBUILDER_ASSETS). Cached outside the work tree; a cold build
# takes about 12 minutes here.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.2}
ETCD_VERSION=${ETCD_VERSION:-3.6.16}
STAGING_VERSION=0.${K8S_VERSION#1.}
CACHE=${GALACTICTEST_TESTBIN_CACHE:-/var/cache/galactic-node/testbin}
OUT="$CACHE/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"
export PATH="$PATH:/usr/local/go/bin"
export GOFLAGS=-mod=mod

if [ -x "$OUT/kube-apiserver" ] && [ -x "$OUT/etcd" ] && [ -x "$OUT/kubectl" ]; then
	echo "$OUT"
	exit 0
fi
mkdir -p "$OUT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

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

build_apiserver() {
	local dir="$work/apiserver"
	mkdir -p "$dir"
	cat >"$dir/main.go" <<'GO'
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() { os.Exit(cli.Run(app.NewAPIServerCommand())) }
GO
	local gomod
	gomod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
	{
		echo "module testbin/apiserver"
		echo
		echo "go 1.26"
		echo
		echo "require k8s.io/kubernetes v$K8S_VERSION"
		echo
		grep -E '^\s*k8s\.io/[^ ]+ => \./staging' "$gomod" |
			awk -v v="v$STAGING_VERSION" '{print "replace " $1 " => " $1 " " v}'
	} >"$dir/go.mod"
	local minor=${K8S_VERSION#1.}
	minor=${minor%%.*}
	local ldflags="-X k8s.io/component-base/version.gitVersion=v$K8S_VERSION"
	ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
	(cd "$dir" && go mod tidy >&2 &&
		go build -ldflags "$ldflags" -o "$OUT/kube-apiserver.tmp" . && mv "$OUT/kube-apiserver.tmp" "$OUT/kube-apiserver")
}

# kubectl is its own staging module: no k8s.io/kubernetes needed.
build_kubectl() {
	local dir="$work/kubectl"
	mkdir -p "$dir"
	cat >"$dir/main.go" <<'GO'
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
	(cd "$dir" && go mod init testbin/kubectl >/dev/null 2>&1 &&
		go get "k8s.io/kubectl@v$STAGING_VERSION" "k8s.io/component-base@v$STAGING_VERSION" >&2 &&
		go mod tidy >&2 &&
		go build -o "$OUT/kubectl.tmp" . && mv "$OUT/kubectl.tmp" "$OUT/kubectl")
}

[ -x "$OUT/etcd" ] || build_etcd >&2
[ -x "$OUT/kube-apiserver" ] || build_apiserver >&2
[ -x "$OUT/kubectl" ] || build_kubectl >&2
echo "$OUT"
