# Sourced by hack/testbin.sh and hack/e2ebin.sh: the wrapper module their
# Kubernetes commands are built in, and the flags they are built with. Both
# build from the same module graph with the same flags, so that the
# packages the commands share (client-go, apiserver, api...) come out of one
# compile in Go's build cache.
#
# Needs K8S_VERSION (1.x.y) set.

K8S_STAGING_VERSION=0.${K8S_VERSION#1.}

# k8s_module DIR NAME writes DIR/go.mod: module NAME requiring
# k8s.io/kubernetes, with its staging modules (./staging replaces in its
# own go.mod) replaced by their published versions, which is how the proxy
# serves them.
k8s_module() {
	local dir=$1 name=$2 gomod
	gomod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
	mkdir -p "$dir"
	{
		echo "module $name"
		echo
		echo "go 1.26"
		echo
		echo "require k8s.io/kubernetes v$K8S_VERSION"
		echo
		grep -E '^\s*k8s\.io/[^ ]+ => \./staging' "$gomod" |
			awk -v v="v$K8S_STAGING_VERSION" '{print "replace " $1 " => " $1 " " v}'
	} >"$dir/go.mod"
}

# k8s_ldflags prints the -ldflags that stamp the version, as the release
# build does: the kubelet and the API server report it, and compare it.
k8s_ldflags() {
	local minor=${K8S_VERSION#1.}
	minor=${minor%%.*}
	echo "-X k8s.io/component-base/version.gitVersion=v$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
}

# k8s_build DIR OUT CMD... builds those of the commands ./CMD of the module
# in DIR that OUT lacks, in one go build, so that their links run side by
# side and beside the compiles, into a scratch folder under OUT, and moves
# each into OUT: an interrupted build never leaves a binary a cache check
# would trust.
k8s_build() {
	local dir=$1 out=$2 cmd
	shift 2
	local tmp="$out/.build.tmp" missing=() pkgs=()
	for cmd in "$@"; do
		if [ ! -x "$out/$cmd" ]; then
			missing+=("$cmd")
			pkgs+=("./$cmd")
		fi
	done
	((${#missing[@]})) || return 0
	(cd "$dir" && go mod tidy >&2)
	rm -rf "$tmp" && mkdir -p "$tmp"
	(cd "$dir" && go build -ldflags "$(k8s_ldflags)" -o "$tmp/" "${pkgs[@]}")
	for cmd in "${missing[@]}"; do
		mv "$tmp/$cmd" "$out/$cmd"
	done
	rmdir "$tmp"
}
