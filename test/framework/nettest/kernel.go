package nettest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// RequireKernel skips t when the running kernel is older than minVersion
// ("6.6"), naming the feature that needs it, as cilium/ebpf's
// testutils.SkipOnOldKernel does. Under CI=true it fails instead: CI's
// machines run a kernel new enough, and a CI run that skipped would pass
// without testing the datapath. A release uname cannot be read fails t
// everywhere: the answer would be a guess.
func RequireKernel(t testing.TB, minVersion, feature string) {
	t.Helper()
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatalf("kernel version for %s: uname: %v", feature, err)
	}
	release := unix.ByteSliceToString(uts.Release[:])
	old, err := kernelOlder(release, minVersion)
	if err != nil {
		t.Fatalf("kernel version for %s: %v", feature, err)
	}
	if !old {
		return
	}
	msg := fmt.Sprintf("needs Linux %s or later for %s; this kernel is %s", minVersion, feature, release)
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s (CI=true: never skipped in CI)", msg)
	}
	t.Skip(msg)
}

// kernelOlder reports whether release (uname -r: "6.18.44-fc-v1045") is
// older than min ("6.6" or "6.6.1").
func kernelOlder(release, min string) (bool, error) {
	have, err := parseKernelVersion(release)
	if err != nil {
		return false, fmt.Errorf("release %q: %w", release, err)
	}
	want, err := parseKernelVersion(min)
	if err != nil {
		return false, fmt.Errorf("minimum %q: %w", min, err)
	}
	for i := range have {
		if have[i] != want[i] {
			return have[i] < want[i], nil
		}
	}
	return false, nil
}

// parseKernelVersion reads major.minor[.patch] from the start of s; what
// follows the numbers (a distribution's suffix) is ignored.
func parseKernelVersion(s string) ([3]int, error) {
	var v [3]int
	end := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if end >= 0 {
		s = s[:end]
	}
	parts := strings.Split(strings.TrimSuffix(s, "."), ".")
	if len(parts) < 2 || len(parts) > 3 {
		return v, fmt.Errorf("want major.minor[.patch]")
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil {
			return v, fmt.Errorf("want major.minor[.patch]: %w", err)
		}
		v[i] = n
	}
	return v, nil
}

// RequireTCX is RequireKernel for TCX (BPF_LINK_CREATE at tcx/ingress,
// Linux 6.6), which every test that registers a tap's rows needs: the
// registration attaches the datapath program.
func RequireTCX(t testing.TB) {
	t.Helper()
	RequireKernel(t, "6.6", "TCX")
}
