// Package cniinstall installs the CNI plugin and the network's conflist into
// the host's CNI folders, the daemon's seccomp profile where the kubelet
// reads Localhost profiles, and the operator CLI (galactic-node itself) on
// the host. Each file is replaced by a rename, so the container
// runtime, which may read either at any moment, sees the old file or the new
// one and never a part of one.
package cniinstall

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/libcni"
)

// Config names the sources and the destination folders.
type Config struct {
	Plugin   string // the plugin binary to install
	Conflist string // the network's conflist to install
	BinDir   string // the host's CNI plugin folder
	ConfDir  string // the host's CNI configuration folder
	// Seccomp is the daemon's seccomp profile, installed into SeccompDir
	// (the kubelet's seccomp folder, or a folder under it) before the
	// daemon's container is created; both empty installs none.
	Seccomp, SeccompDir string
	// CLI is the galactic-node binary, installed into CLIDir so that the
	// runbooks' commands run on the node itself; both empty installs none.
	CLI, CLIDir string
}

// Installed is one file as it now is at its destination.
type Installed struct {
	Path    string
	Bytes   int64
	SHA256  string
	Changed bool // false when the destination already held these bytes and mode
}

// Install checks both sources, then installs the plugin and, after it, the
// conflist. Nothing is written unless both sources are sound. Running it
// again with the same sources changes nothing.
func Install(ctx context.Context, c Config, log *slog.Logger) ([]Installed, error) {
	conf, err := os.ReadFile(c.Conflist)
	if err != nil {
		return nil, fmt.Errorf("read conflist: %w", err)
	}
	if err := validateConflist(conf); err != nil {
		return nil, fmt.Errorf("conflist %s: %w", c.Conflist, err)
	}
	if err := checkPlugin(c.Plugin); err != nil {
		return nil, err
	}
	files := []struct {
		src, dir string
		mode     fs.FileMode
	}{
		{c.Plugin, c.BinDir, 0o755},
		{c.Conflist, c.ConfDir, 0o644},
	}
	if (c.Seccomp == "") != (c.SeccompDir == "") {
		return nil, errors.New("a seccomp profile and its folder go together")
	}
	if (c.CLI == "") != (c.CLIDir == "") {
		return nil, errors.New("the CLI binary and its folder go together")
	}
	if c.CLI != "" {
		if err := checkPlugin(c.CLI); err != nil {
			return nil, fmt.Errorf("CLI: %w", err)
		}
		files = append(files, struct {
			src, dir string
			mode     fs.FileMode
		}{c.CLI, c.CLIDir, 0o755})
	}
	if c.Seccomp != "" {
		b, err := os.ReadFile(c.Seccomp)
		if err != nil {
			return nil, fmt.Errorf("read seccomp profile: %w", err)
		}
		if err := validateSeccomp(b); err != nil {
			return nil, fmt.Errorf("seccomp profile %s: %w", c.Seccomp, err)
		}
		// The profile is not read before the daemon's container is
		// created, so its order against the CNI files does not matter.
		files = append(files, struct {
			src, dir string
			mode     fs.FileMode
		}{c.Seccomp, c.SeccompDir, 0o644})
	}
	// The plugin goes first: a runtime that finds the conflist must find
	// the plugin it names.
	var done []Installed
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return done, fmt.Errorf("install %s: %w", f.src, err)
		}
		in, err := installFile(f.src, f.dir, f.mode)
		if err != nil {
			return done, err
		}
		log.Info("installed", "source", f.src, "path", in.Path, "bytes", in.Bytes, "sha256", in.SHA256, "changed", in.Changed)
		done = append(done, in)
	}
	return done, nil
}

// validateConflist refuses what a runtime could not use: it must parse as a
// conflist, with a name and at least one plugin.
func validateConflist(b []byte) error {
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		return err
	}
	if l.Name == "" {
		return errors.New("no network name")
	}
	if len(l.Plugins) == 0 {
		return errors.New("no plugins")
	}
	return nil
}

// validateSeccomp refuses a profile a runtime would reject at container
// creation, long after the install said it was done: it must be a JSON
// object with a default action and named syscall rules.
func validateSeccomp(b []byte) error {
	var p struct {
		DefaultAction string `json:"defaultAction"`
		Syscalls      []struct {
			Names  []string `json:"names"`
			Action string   `json:"action"`
		} `json:"syscalls"`
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	if p.DefaultAction == "" {
		return errors.New("no defaultAction")
	}
	for i, r := range p.Syscalls {
		if len(r.Names) == 0 || r.Action == "" {
			return fmt.Errorf("syscall rule %d names no syscall or action", i)
		}
	}
	return nil
}

func checkPlugin(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("plugin: %w", err)
	}
	if !st.Mode().IsRegular() || st.Size() == 0 {
		return fmt.Errorf("plugin %s: not a non-empty regular file", path)
	}
	return nil
}

// installFile puts src into dir under its own name with mode: a temporary
// file in dir, synced, renamed over the target, then dir synced so that
// the rename survives a crash.
func installFile(src, dir string, mode fs.FileMode) (Installed, error) {
	target := filepath.Join(dir, filepath.Base(src))
	// Missing folders are made as kubelet's DirectoryOrCreate would have.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Installed{}, fmt.Errorf("make folder %s: %w", dir, err)
	}
	sum, size, err := fileSHA256(src)
	if err != nil {
		return Installed{}, err
	}
	in := Installed{Path: target, Bytes: size, SHA256: sum}
	if same(target, sum, mode) {
		return in, nil
	}
	// A leftover of an install that died midway is removed, not renamed:
	// it may be partial.
	pattern := "." + filepath.Base(target) + ".tmp-*"
	if old, _ := filepath.Glob(filepath.Join(dir, pattern)); len(old) > 0 {
		for _, o := range old {
			_ = os.Remove(o)
		}
	}
	// The temporary name ends in neither .conflist nor .conf, so a runtime
	// scanning the folder ignores it.
	tmp, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return Installed{}, fmt.Errorf("install %s: %w", target, err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	if err := copyInto(tmp, src, mode); err != nil {
		tmp.Close()
		return Installed{}, fmt.Errorf("install %s: %w", target, err)
	}
	if err := tmp.Close(); err != nil {
		return Installed{}, fmt.Errorf("install %s: %w", target, err)
	}
	// The source may have changed since it was hashed; the log must name
	// what was installed.
	if got, _, err := fileSHA256(tmp.Name()); err != nil || got != sum {
		return Installed{}, fmt.Errorf("install %s: %s changed while being copied", target, src)
	}
	if err := os.Rename(tmp.Name(), target); err != nil {
		return Installed{}, fmt.Errorf("install %s: %w", target, err)
	}
	if err := syncDir(dir); err != nil {
		return Installed{}, fmt.Errorf("install %s: %w", target, err)
	}
	in.Changed = true
	return in, nil
}

func copyInto(dst *os.File, src string, mode fs.FileMode) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.Copy(dst, f); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	// Chmod after writing, not a create mode: the umask would narrow it.
	if err := dst.Chmod(mode); err != nil {
		return err
	}
	return dst.Sync()
}

// same reports whether target already is a regular file with these bytes
// and this mode, so a rerun leaves it, its inode and its times alone.
func same(target, sum string, mode fs.FileMode) bool {
	st, err := os.Lstat(target)
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != mode {
		return false
	}
	got, _, err := fileSHA256(target)
	return err == nil && got == sum
}

func fileSHA256(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, fmt.Errorf("hash %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync folder %s: %w", dir, err)
	}
	return nil
}
