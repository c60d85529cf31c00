package nettest

import (
	"fmt"
	"strings"
	"testing"
)

func TestKernelOlder(t *testing.T) {
	for _, tc := range []struct {
		release, min string
		older        bool
	}{
		{"6.18.44-fc-v1045", "6.6", false},
		{"6.6.0", "6.6", false},
		{"6.6", "6.6", false},
		{"6.5.13-generic", "6.6", true},
		{"5.15.0-91-generic", "6.6", true},
		{"7.0-rc1", "6.6", false},
		{"6.6.1", "6.6.2", true},
		{"6.10.0", "6.6", false}, // numbers, not strings
	} {
		got, err := kernelOlder(tc.release, tc.min)
		if err != nil || got != tc.older {
			t.Errorf("kernelOlder(%q, %q) = %v, %v; want %v", tc.release, tc.min, got, err, tc.older)
		}
	}
	for _, bad := range []string{"", "6", "linux", "6.x.1", "1.2.3.4"} {
		if _, err := kernelOlder(bad, "6.6"); err == nil {
			t.Errorf("kernelOlder(%q) accepted it", bad)
		}
	}
}

// recorder is a testing.TB that records how RequireKernel ends a test.
type recorder struct {
	testing.TB
	ended []string // "skip: msg" or "fatal: msg", in order
}

func (r *recorder) Helper() {}
func (r *recorder) Skip(args ...any) {
	r.ended = append(r.ended, "skip: "+fmt.Sprint(args...))
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.ended = append(r.ended, "fatal: "+fmt.Sprintf(format, args...))
}

// A kernel older than a test needs skips it, saying which kernel and
// feature, except under CI=true, where it fails: CI never skips silently.
func TestRequireKernelSkipsOnOldKernelsAndFailsInCI(t *testing.T) {
	for ci, want := range map[string]string{"": "skip: needs Linux 999.1 or later for TCX; this kernel is ", "true": "fatal: needs Linux 999.1 or later for TCX"} {
		t.Setenv("CI", ci)
		r := &recorder{TB: t}
		RequireKernel(r, "999.1", "TCX")
		if len(r.ended) == 0 || !strings.HasPrefix(r.ended[0], want) {
			t.Errorf("CI=%q: RequireKernel ended the test with %q; want it to start %q", ci, r.ended, want)
		}
		r = &recorder{TB: t}
		RequireKernel(r, "2.6", "TCX")
		if len(r.ended) != 0 {
			t.Errorf("CI=%q: on a new enough kernel RequireKernel ended the test with %q", ci, r.ended)
		}
	}
}
