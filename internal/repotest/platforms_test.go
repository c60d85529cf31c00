package repotest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The hub controller and the admin API (with the operator's client of it)
// must build on systems other than Linux: Linux-only code lives in _linux.go
// files beside a _other.go that fails clearly (issue 18 point 5). Vetting
// for darwin type-checks every file that would build there, tests included,
// so a new unix.* call outside a _linux.go file fails here, not on a
// developer's laptop.
func TestHubAndAdminBuildOffLinux(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles the hub and admin packages for darwin (up to a minute cold)")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// go test puts its own go first on PATH, so this is the toolchain under test.
	cmd := exec.CommandContext(t.Context(), "go", "vet", "./hubctl/...", "./admin/...")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=darwin")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("GOOS=darwin go vet ./hubctl/... ./admin/...: %v\n%s", err, out)
	}
}
