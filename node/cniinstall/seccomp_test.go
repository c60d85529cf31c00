package cniinstall

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The profile the DaemonSet's daemon container names, as shipped.
const shippedProfile = "../../deploy/node/seccomp/galactic-node.json"

func TestTheSeccompProfileIsInstalledBesideTheCNIFiles(t *testing.T) {
	e := newEnv(t, []byte("plugin"), goodConflist)
	e.cfg.Seccomp = shippedProfile
	e.cfg.SeccompDir = filepath.Join(e.hostDir, "var/lib/kubelet/seccomp/galactic")
	done, err := Install(context.Background(), e.cfg, quiet())
	if err != nil || len(done) != 3 {
		t.Fatalf("install: %v, %d files", err, len(done))
	}
	want, err := os.ReadFile(shippedProfile)
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, filepath.Join(e.cfg.SeccompDir, "galactic-node.json"), want, 0o644)
}

func TestABadSeccompProfileChangesNothing(t *testing.T) {
	for name, profile := range map[string]string{
		"not json":          `{"defaultAction": `,
		"no default action": `{"syscalls": []}`,
		"a nameless rule":   `{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"action": "SCMP_ACT_ERRNO"}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, []byte("plugin"), goodConflist)
			e.cfg.Seccomp = filepath.Join(e.srcDir, "galactic-node.json")
			e.cfg.SeccompDir = filepath.Join(e.hostDir, "seccomp")
			write(t, e.cfg.Seccomp, []byte(profile), 0o644)
			if _, err := Install(context.Background(), e.cfg, quiet()); err == nil || !strings.Contains(err.Error(), "seccomp profile") {
				t.Fatalf("got %v, want an error naming the seccomp profile", err)
			}
			for _, p := range []string{e.plugin, e.conf, e.cfg.SeccompDir} {
				if _, err := os.Stat(p); !os.IsNotExist(err) {
					t.Errorf("%s exists after a refused install", p)
				}
			}
		})
	}
	e := newEnv(t, []byte("plugin"), goodConflist)
	e.cfg.Seccomp = shippedProfile
	if _, err := Install(context.Background(), e.cfg, quiet()); err == nil {
		t.Fatal("a profile with no folder was accepted")
	}
}

func TestTheCLIIsInstalledExecutable(t *testing.T) {
	e := newEnv(t, []byte("plugin"), goodConflist)
	e.cfg.CLI = filepath.Join(e.srcDir, "galactic-node")
	e.cfg.CLIDir = filepath.Join(e.hostDir, "opt/galactic/bin")
	write(t, e.cfg.CLI, []byte("\x7fELF cli"), 0o700)
	if _, err := Install(context.Background(), e.cfg, quiet()); err != nil {
		t.Fatal(err)
	}
	checkFile(t, filepath.Join(e.cfg.CLIDir, "galactic-node"), []byte("\x7fELF cli"), 0o755)
	e.cfg.CLIDir = ""
	if _, err := Install(context.Background(), e.cfg, quiet()); err == nil {
		t.Fatal("a CLI with no folder was accepted")
	}
}
