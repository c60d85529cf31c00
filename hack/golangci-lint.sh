#!/usr/bin/env bash
# Builds the pinned golangci-lint from the Go module proxy, once per
# machine, and prints its path. Cached outside the work tree, like
# hack/testbin.sh: `go run pkg@version` would link it again on every
# `make lint`. A new CI machine builds it on first use (about 2 minutes).
set -euo pipefail

export PATH="$PATH:/usr/local/go/bin"
VERSION=${GOLANGCI_LINT_VERSION:-v2.15.0}
CACHE=${GALACTICTEST_LINT_CACHE:-/var/cache/galactic-node/golangci-lint}
OUT="$CACHE/$VERSION"

if [ -x "$OUT/golangci-lint" ]; then
	echo "$OUT/golangci-lint"
	exit 0
fi
mkdir -p "$OUT"
# Built into a scratch folder and moved into place, so that an interrupted
# build never leaves a binary the check above would trust.
tmp=$(mktemp -d "$CACHE/build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
GOBIN="$tmp" GOFLAGS=-mod=mod go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$VERSION" >&2
mv "$tmp/golangci-lint" "$OUT/golangci-lint"
echo "$OUT/golangci-lint"
