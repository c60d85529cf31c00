package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// maxPluginBytes bounds the shipped plugin: it is copied to every node and
// exec'd by the runtime for every attachment (issue 49: 9,009,945 bytes
// then, 8.6 MB a release before).
const maxPluginBytes = 9_000_000

// TestThePluginStaysUnder9MB builds galactic-tap as `make images` builds
// the one it ships, with the Makefile's own flags, and fails over 9 MB.
func TestThePluginStaysUnder9MB(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the plugin")
	}
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^TAP_LDFLAGS\s*:=\s*(.*)$`).FindSubmatch(mk)
	if m == nil || !strings.Contains(string(mk), `-ldflags "$(TAP_LDFLAGS) -X main.buildVersion=$(IMAGE_VERSION)"`) {
		t.Fatal("the Makefile's images target no longer builds galactic-tap with TAP_LDFLAGS: keep this test building what ships")
	}
	bin := filepath.Join(t.TempDir(), "galactic-tap")
	build := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags", string(m[1])+" -X main.buildVersion=v0.0.0-size", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v: %s", err, out)
	}
	fi, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("galactic-tap as shipped: %d bytes", fi.Size())
	if fi.Size() > maxPluginBytes {
		t.Fatalf("galactic-tap is %d bytes, over %d: see what it links (go list -deps ./cmd/galactic-tap)", fi.Size(), maxPluginBytes)
	}
}
