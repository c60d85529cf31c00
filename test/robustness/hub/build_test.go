package hub

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// splice is one call the hooked build adds to the hub's source: old, which
// must occur exactly once in file, becomes new.
type splice struct{ file, old, new string }

// hookSites are the calls into hubctl/testhooks.go, which the hooked build
// splices into the hub's source with `go build -overlay`: the product's
// files on disk carry none, and the calls compile only with the
// galactic_testhooks tag, which brings the hooks. A splice that no longer
// applies fails the build, naming itself: the hub's code moved, and the
// variant must follow it.
var hookSites = []splice{
	// The controller's API, wrapped as the chaos suite wraps it
	// (hubctl/export_test.go), for direct-read-off.
	{"hubctl/controller.go", "api: fenced{API: api, fence: cfg.Fence}", "api: fenced{API: testhookAPI(api, log), fence: cfg.Fence}"},
	// The two mutants the hub's own suite lets live.
	{"hubctl/confirm.go", "\t\tcf.gather()\n", "\t\tif !testhookBroken(\"no-gather\") {\n\t\t\tcf.gather()\n\t\t}\n"},
	{"hubctl/controller.go", "if claim.Deleting && claim.Phase != PhaseReleasing {",
		"if claim.Deleting && claim.Phase != PhaseReleasing && !testhookBroken(\"no-deleting-check\") {"},
	// The wakeup of the networks that wait for a claim to go.
	{"hubctl/controller.go", "func (c *Controller) ClaimGone() {\n", "func (c *Controller) ClaimGone() {\n\tif testhookBroken(\"lost-wakeup\") {\n\t\treturn\n\t}\n"},
}

// builds are the two galactic-hubctl binaries the harness runs: the
// product's, as the images build it, and the hooked one.
type builds struct{ product, hooked string }

var (
	buildOnce sync.Once
	built     builds
	buildErr  error
)

// binaries builds both once per test binary, side by side: without -race,
// which only slows the replicas, and as the images build (static, trimmed
// paths), so that the build cache the integration tests fill serves them.
func binaries(t *testing.T) builds {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "hub-robustness-bin-")
		if err != nil {
			buildErr = fmt.Errorf("binaries folder: %w", err)
			return
		}
		built = builds{product: filepath.Join(dir, "galactic-hubctl"), hooked: filepath.Join(dir, "galactic-hubctl-hooked")}
		var wg sync.WaitGroup
		var errProduct, errHooked error
		wg.Go(func() { errProduct = goBuild(built.product) })
		wg.Go(func() {
			overlay, err := writeOverlay(dir)
			if err != nil {
				errHooked = err
				return
			}
			errHooked = goBuild(built.hooked, "-tags", "galactic_testhooks", "-overlay", overlay)
		})
		wg.Wait()
		buildErr = errors.Join(errProduct, errHooked)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

// goBuild builds cmd/galactic-hubctl into out.
func goBuild(out string, flags ...string) error {
	args := append([]string{"build", "-trimpath"}, flags...)
	args = append(args, "-o", out, "./cmd/galactic-hubctl")
	cmd := exec.Command(goTool(), args...)
	cmd.Dir = repoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, b)
	}
	return nil
}

// writeOverlay writes the spliced copies of the hub's files into dir and
// the overlay that maps the originals to them.
func writeOverlay(dir string) (string, error) {
	files := map[string]string{}
	var order []string
	for _, s := range hookSites {
		if _, ok := files[s.file]; !ok {
			b, err := os.ReadFile(filepath.Join(repoRoot(), s.file))
			if err != nil {
				return "", fmt.Errorf("read %s to splice: %w", s.file, err)
			}
			files[s.file] = string(b)
			order = append(order, s.file)
		}
		if n := strings.Count(files[s.file], s.old); n != 1 {
			return "", fmt.Errorf("the splice %q finds %d places in %s, want 1: the hub's code moved; update hookSites", s.old, n, s.file)
		}
		files[s.file] = strings.Replace(files[s.file], s.old, s.new, 1)
	}
	replace := map[string]string{}
	for i, f := range order {
		copyPath := filepath.Join(dir, fmt.Sprintf("splice-%d-%s", i, filepath.Base(f)))
		if err := os.WriteFile(copyPath, []byte(files[f]), 0o600); err != nil {
			return "", fmt.Errorf("write spliced %s: %w", f, err)
		}
		replace[filepath.Join(repoRoot(), f)] = copyPath
	}
	b, err := json.Marshal(map[string]any{"Replace": replace})
	if err != nil {
		return "", fmt.Errorf("encode overlay: %w", err)
	}
	path := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return "", fmt.Errorf("write overlay: %w", err)
	}
	return path, nil
}

// goTool is the go command on PATH: `go test` puts its own toolchain's
// bin first there (Go 1.19 and later), so it is the go that built this
// test.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "go"
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}
