package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestTheLinkerFlagsWin(t *testing.T) {
	if v := Version("v1.2.3"); v != "v1.2.3" {
		t.Errorf("Version(v1.2.3) = %q", v)
	}
	if v := Version("dev"); v == "" {
		t.Error("Version(dev) is empty")
	}
}

func TestWithoutLinkerFlagsTheModuleSays(t *testing.T) {
	for _, tc := range []struct {
		main     string
		settings map[string]string
		want     string
	}{
		{"v0.0.0-20260101000000-abcdef123456", nil, "v0.0.0-20260101000000-abcdef123456"},
		{"(devel)", map[string]string{"vcs.revision": "abc", "vcs.modified": "false"}, "abc"},
		{"(devel)", map[string]string{"vcs.revision": "abc", "vcs.modified": "true"}, "abc-dirty"},
		{"", nil, "dev"},
	} {
		bi := &debug.BuildInfo{Main: debug.Module{Version: tc.main}}
		for k, v := range tc.settings {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: k, Value: v})
		}
		if got := fromBuild(bi); got != tc.want {
			t.Errorf("%q %v: %q, want %q", tc.main, tc.settings, got, tc.want)
		}
	}
}
