// Package freshclone runs make test-unit as a newcomer would. A package of
// its own, run by make test-fresh-clone rather than with the others: a
// fresh clone's compile takes many minutes on two cores, which would
// compete with the packages run in parallel and eat their -timeout.
package freshclone

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// freshCloneCache is the build cache of the user make test-unit runs as
// here, kept across runs as hack/testbin.sh keeps its binaries: a fresh
// clone compiles the whole tree and its dependencies, minutes on two cores,
// and what the cache holds never changes what a build produces.
const freshCloneCache = "/var/cache/galactic-node/fresh-clone-gocache"

// README says `make test-unit` runs the tests that need no root. It must
// pass as a newcomer runs it: on a fresh clone, with no earlier target
// (nothing under bin/, no images or digests), as a user that is not root.
// The clone is of HEAD: what is not committed is not tested here.
func TestMakeTestUnitPassesOnAFreshCloneAsAnotherUser(t *testing.T) {
	if testing.Short() {
		t.Skip("clones the repository and runs make test-unit in it: minutes of compiling")
	}
	nettest.RequirePrivileged(t) // it changes users and mounts the module cache
	for _, tool := range []string{"git", "make", "setpriv", "unshare", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("needs %s: %v", tool, err)
		}
	}
	goBin, _ := exec.LookPath("go")
	gomodcache := strings.TrimSpace(nettest.Run(t, "go", "env", "GOMODCACHE"))

	// Not t.TempDir: its parent is 0700, which the other user cannot enter.
	dir, err := os.MkdirTemp("", "galactic-fresh-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src, home, mod := filepath.Join(dir, "src"), filepath.Join(dir, "home"), filepath.Join(dir, "mod")
	head := strings.TrimSpace(nettest.Run(t, "git", "-C", "../..", "rev-parse", "HEAD"))
	// --no-local: a local clone hard-links the objects, and the chown
	// below would then change the source repository's files too.
	nettest.Run(t, "git", "clone", "--quiet", "--no-local", "--no-checkout", "../..", src)
	nettest.Run(t, "git", "-C", src, "checkout", "--quiet", "--detach", head)
	for _, d := range []string{home, mod, freshCloneCache} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	nettest.Run(t, "chown", "-R", "nobody:nogroup", src, home, freshCloneCache)

	// The module cache is root's, under /root, which others cannot enter:
	// it is bound read-only at a path they can, in a mount namespace of
	// the command's own, and GOPROXY=off keeps the go command to it (no
	// network, and a module missing from it fails the run).
	script := `set -e
mount --bind "$1" "$2"
mount -o remount,bind,ro "$2"
shift 2
exec "$@"`
	// Within the go test's own -timeout (make test-fresh-clone's), with
	// room to report what the run printed.
	limit := 45 * time.Minute
	if d, ok := t.Deadline(); ok {
		limit = time.Until(d) - time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", gomodcache, mod,
		"setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "make", "-C", src, "test-unit")
	// A newcomer's environment: none of CI's or the harness's variables
	// (CI=true turns a skipped privileged test into a failure).
	cmd.Env = []string{
		"PATH=" + filepath.Dir(goBin) + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + home,
		"GOPATH=" + filepath.Join(home, "go"),
		"GOCACHE=" + freshCloneCache,
		"GOMODCACHE=" + mod,
		"GOPROXY=off",
		"GOTOOLCHAIN=local",
	}
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make test-unit on a fresh clone as nobody: %v (after %s)\n%s", err, time.Since(start).Round(time.Second), out)
	}
	t.Logf("make test-unit on a fresh clone as nobody passed in %s", time.Since(start).Round(time.Second))
}
