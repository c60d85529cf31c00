package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The defaults are what the DaemonSet runs: the plugin alone, and nothing
// written into the runtime's configuration folder.
func TestInstallCNIDefaultsWriteNoConflist(t *testing.T) {
	var c installCNIFlags
	if err := installCNIFlagSet(&c).Parse(nil); err != nil {
		t.Fatal(err)
	}
	if c.IntoConfDir || c.MultusConfDir != "" {
		t.Fatalf("defaults install a conflist: into the runtime's folder %v, Multus' folder %q", c.IntoConfDir, c.MultusConfDir)
	}
	if err := c.Check(); err != nil {
		t.Fatalf("the defaults are refused: %v", err)
	}
}

func TestInstallCNIRunsAndRefusesMisuse(t *testing.T) {
	src, host := t.TempDir(), t.TempDir()
	plugin := filepath.Join(src, "galactic-tap")
	conflist := filepath.Join(src, "10-galactic.conflist")
	if err := os.WriteFile(plugin, []byte("plugin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conflist, []byte(`{"cniVersion": "1.1.0", "name": "galactic", "plugins": [{"type": "galactic-tap"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	netd := filepath.Join(host, "etc/cni/net.d")
	base := []string{"install-cni", "--plugin", plugin, "--conflist", conflist, "--cni-bin-dir", filepath.Join(host, "opt/cni/bin"),
		"--cni-conf-dir", netd, "--seccomp-profile=", "--seccomp-dir=", "--cli=", "--cli-dir=", "--log-format", "text"}
	// In order: the last case is the one that asks for the runtime's folder.
	for _, c := range []struct {
		args    []string
		code    int
		stderr  string
		written string // a file that must exist afterwards
	}{
		{nil, 0, "msg=installed", "opt/cni/bin/galactic-tap"},
		{[]string{"--multus-conf-dir", netd}, 2, "is the runtime's configuration folder", ""},
		{[]string{"--multus-conf-dir", filepath.Join(host, "etc/cni/multus/net.d")}, 0, "msg=installed", "etc/cni/multus/net.d/10-galactic.conflist"},
		{[]string{"--conflist-into-default-network-dir", "--conflist="}, 2, "needs a conflist", ""},
		{[]string{"--conflist-into-default-network-dir"}, 0, "level=WARN", "etc/cni/net.d/10-galactic.conflist"},
	} {
		asked := strings.Contains(strings.Join(c.args, " "), "--conflist-into-default-network-dir")
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append(append([]string{}, base...), c.args...), nil, &stdout, &stderr)
		if code != c.code || !strings.Contains(stderr.String(), c.stderr) {
			t.Errorf("install-cni %v: exit %d, stderr %s; want %d and %q", c.args, code, stderr.String(), c.code, c.stderr)
		}
		if c.written != "" {
			if _, err := os.Stat(filepath.Join(host, c.written)); err != nil {
				t.Errorf("install-cni %v: %v", c.args, err)
			}
		}
		if ents, _ := os.ReadDir(netd); len(ents) != 0 && !asked {
			t.Errorf("install-cni %v wrote into the runtime's folder, unasked: %v", c.args, ents)
		}
	}
}
