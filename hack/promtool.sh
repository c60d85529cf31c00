#!/usr/bin/env bash
# Builds promtool (the alert rules' unit-test runner) from the Go module
# proxy, once per machine, at the version of github.com/prometheus/prometheus
# that go.mod requires, so the rules are tested by the same PromQL the repo's
# Go tests parse with. Prints its path. Cached outside the work tree, like
# hack/testbin.sh; a new CI machine builds it on first use.
set -euo pipefail

cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
VERSION=${PROMTOOL_VERSION:-$(go list -m -f '{{.Version}}' github.com/prometheus/prometheus)}
CACHE=${GALACTICTEST_PROMTOOL_CACHE:-/var/cache/galactic-node/promtool}
OUT="$CACHE/$VERSION"

if [ -x "$OUT/promtool" ]; then
	echo "$OUT/promtool"
	exit 0
fi
mkdir -p "$OUT"
# Built into a scratch folder and moved into place, so that an interrupted
# build never leaves a promtool the check above would trust.
tmp=$(mktemp -d "$CACHE/build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
GOBIN="$tmp" GOFLAGS=-mod=mod go install "github.com/prometheus/prometheus/cmd/promtool@$VERSION" >&2
mv "$tmp/promtool" "$OUT/promtool"
echo "$OUT/promtool"
