package admin_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/datum-cloud/galactic-node/admin"
)

// TestSettingTheSocketModeNeverFollowsASymlink replaces a freshly bound
// socket with a symlink to another file, as an attacker racing the daemon
// between bind and chmod would: the mode step refuses, and the file the
// link points at keeps its mode.
func TestSettingTheSocketModeNeverFollowsASymlink(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(victim, 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "admin.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, sock); err != nil {
		t.Fatal(err)
	}
	err = admin.RestrictSocket(sock, nil)
	fi, statErr := os.Stat(victim)
	if statErr != nil {
		t.Fatal(statErr)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("the symlink's target changed mode to %04o", fi.Mode().Perm())
	}
	if err == nil {
		t.Error("setting the mode through a symlink succeeded, want an error")
	}
}

// TestTheSocketIsBornPrivate: ListenUnix makes its folder 0750 and the
// socket 0600, and refuses to replace a live one.
func TestTheSocketIsBornPrivate(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "run", "admin.sock")
	l, err := admin.ListenUnix(sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if fi, err := os.Lstat(sock); err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket %v %v, want a 0600 socket", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Dir(sock)); err != nil || fi.Mode().Perm() != admin.SocketFolderMode {
		t.Fatalf("folder %v %v, want %04o", fi.Mode(), err, admin.SocketFolderMode)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if _, err := admin.ListenUnix(sock, nil); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("a second listener on a live socket: %v", err)
	}
}
