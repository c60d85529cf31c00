#!/usr/bin/env bash
# Prints the path of the pinned golangci-lint, built once per machine
# (hack/gotool.sh): `go run pkg@version` would link it again on every
# `make lint`.
set -euo pipefail
exec "$(dirname "$0")/gotool.sh" github.com/golangci/golangci-lint/v2/cmd/golangci-lint \
	"${GOLANGCI_LINT_VERSION:-v2.15.0}" "${GALACTICTEST_LINT_CACHE:-/var/cache/galactic-node/golangci-lint}"
