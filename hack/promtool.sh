#!/usr/bin/env bash
# Prints the path of promtool (the alert rules' unit-test runner), built
# once per machine (hack/gotool.sh) at the version of
# github.com/prometheus/prometheus that go.mod requires, so that the rules
# are tested by the same PromQL the repo's Go tests parse with. Built with
# remove_all_sd: testing rules needs no service discovery, and compiling
# every discovery mechanism (the cloud SDKs, client-go) was most of the
# cold build and enough memory to be OOM-killed on a loaded machine.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
exec hack/gotool.sh github.com/prometheus/prometheus/cmd/promtool \
	"${PROMTOOL_VERSION:-$(go list -m -f '{{.Version}}' github.com/prometheus/prometheus)}" \
	"${GALACTICTEST_PROMTOOL_CACHE:-/var/cache/galactic-node/promtool}" remove_all_sd
