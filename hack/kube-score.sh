#!/usr/bin/env bash
# Prints the path of the pinned kube-score (github.com/zegl/kube-score, an
# outside linter of Kubernetes manifests), built once per machine
# (hack/gotool.sh). integration/kubescore_test.go runs it on the rendered
# deploy/ and holds its findings to docs/operations.md's list.
set -euo pipefail
exec "$(dirname "$0")/gotool.sh" github.com/zegl/kube-score/cmd/kube-score \
	"${KUBE_SCORE_VERSION:-v1.20.0}" "${GALACTICTEST_KUBE_SCORE_CACHE:-/var/cache/galactic-node/kube-score}"
