#!/usr/bin/env bash
# make release VERSION=vX.Y.Z [IMAGE_REPO=registry/path] [DIST=dist]
#
# From a clean tree whose HEAD carries the tag VERSION, writes under DIST:
#   galactic-node_VERSION.oci.tar, galactic-hubctl_VERSION.oci.tar
#       the images (make images), tagged IMAGE_REPO/<image>:VERSION;
#   galactic-node_VERSION.cdx.json, galactic-hubctl_VERSION.cdx.json
#       their CycloneDX SBOMs (hack/sbom), the same bytes each image
#       carries at /usr/share/sbom/<image>.cdx.json;
#   galactic.yaml, galactic-dry-run.yaml
#       deploy/ and deploy/overlays/dry-run-rollout rendered (hack/render)
#       with both images pinned by digest under IMAGE_REPO;
#   SHA256SUMS
#       of all of the above, for `sha256sum -c`.
# Everything is a function of the tagged commit (and the Go toolchain):
# two runs from two clones give the same bytes (integration/release_test.go).
set -euo pipefail

die() { echo "make release: $*" >&2; exit 1; }

version=${VERSION:-}
repo=${IMAGE_REPO:-ghcr.io/datum-cloud}
dist=${DIST:-dist}
make=${MAKE:-make}
go=${GO:-go}

[[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] ||
	die "VERSION=${version:-<unset>}: want a semantic version tag, such as v1.2.3 or v1.2.3-rc.1"
[[ -z $(git status --porcelain) ]] ||
	die "the tree has changes (git status): a release is built from a clean checkout of its tag"
git tag --points-at HEAD | grep -xF -- "$version" >/dev/null ||
	die "HEAD is not tagged $version: tag it first (git tag -a $version), or check the tag out"
# The images' times are those of the last commit that changed their
# sources, which a shallow clone cannot find.
[[ $(git rev-parse --is-shallow-repository) == false ]] ||
	die "a shallow clone: the images' commit and times need the history (git fetch --unshallow)"

# Nothing of the caller's environment may change what is built: only the
# tag, the registry named and the Go toolchain do.
unset MAKEFLAGS MFLAGS MAKELEVEL GOFLAGS GOOS GOARCH GOAMD64 GOEXPERIMENT CGO_ENABLED SOURCE_DATE_EPOCH \
	IMAGE_COMMIT IMAGE_SOURCE IMAGE_VERSION IMAGE_DIR REVISION
export GOWORK=off

# Built aside and moved into place at the end: a failed release leaves the
# one before it as it was.
work="$dist.tmp"
rm -rf "$work"
mkdir -p "$work/build"
trap 'rm -rf "$work"' EXIT
# The revision label names the tagged commit, which is what an operator
# checks out; SOURCE_DATE_EPOCH stays that of the images' sources.
"$make" --no-print-directory images IMAGE_DIR="$work/build" IMAGE_VERSION="$version" \
	IMAGE_REPO="$repo" REVISION="$(git rev-parse HEAD)"

pins=()
for img in galactic-node galactic-hubctl; do
	mv "$work/build/$img.oci.tar" "$work/${img}_$version.oci.tar"
	mv "$work/build/$img.cdx.json" "$work/${img}_$version.cdx.json"
	pins+=(-digest "$img=$(cat "$work/build/$img.digest")")
done
"$go" run ./hack/render -version "$version" -repo "$repo" "${pins[@]}" -out "$work/galactic.yaml" deploy
"$go" run ./hack/render -version "$version" -repo "$repo" "${pins[@]}" -out "$work/galactic-dry-run.yaml" deploy/overlays/dry-run-rollout
rm -rf "$work/build"
(cd "$work" && LC_ALL=C sha256sum -- *.oci.tar *.cdx.json *.yaml | LC_ALL=C sort -k2 >SHA256SUMS)
rm -rf "$dist"
mv "$work" "$dist"
trap - EXIT
echo "make release: $version in $dist/:"
cat "$dist/SHA256SUMS"
