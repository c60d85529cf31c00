#!/usr/bin/env bash
# usage: hack/gotool.sh PACKAGE VERSION CACHE [BUILD_TAGS]
# Builds the command PACKAGE@VERSION from the Go module proxy into
# CACHE/VERSION, once per machine, and prints the binary's path. Tools the
# tests and CI run (promtool, golangci-lint) are built this way, outside the
# work tree, like hack/testbin.sh's API server; a new CI machine builds
# each on first use.
set -euo pipefail

pkg=$1 version=$2 cache=$3 tags=${4:-}
export PATH="$PATH:/usr/local/go/bin"
name=$(basename "$pkg")
out="$cache/$version"

if [ -x "$out/$name" ]; then
	echo "$out/$name"
	exit 0
fi
mkdir -p "$out"
# Built into a scratch folder and moved into place, so that an interrupted
# build never leaves a binary the check above would trust.
tmp=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
GOBIN="$tmp" GOFLAGS=-mod=mod go install -tags="$tags" "$pkg@$version" >&2
mv "$tmp/$name" "$out/$name"
echo "$out/$name"
