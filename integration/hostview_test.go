package integration

import (
	byteorder "encoding/binary"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
)

// The built daemon publishes the host view (docs/datapath.md, "The host
// view"): trusted and renewed while it runs, revoked when it stops, so that
// the program asks the route lookup again at once rather than trust a view
// nobody keeps. The view's content is tested frame by frame in
// ebpf/datapath, with the same watcher.
func TestTheDaemonKeepsTheHostViewWhileItRuns(t *testing.T) {
	n := newNode(t)
	d := n.run(t, "--inventory-file", n.writeInventory(liveAttachment))
	eventually(t, "the daemon publishes the host view", func() (bool, string) {
		return strings.Contains(d.log.String(), "host view published"), d.log.String()
	})
	view, err := ebpf.LoadPinnedMap(filepath.Join(n.bpffs, datapath.PinSubdir, datapath.StateSubdir, "host_view"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer view.Close()
	// validUntil is how long the program trusts the view from now on.
	validUntil := func() time.Duration {
		t.Helper()
		var v [16]byte
		if err := view.Lookup(uint32(0), &v); err != nil {
			t.Fatal(err)
		}
		var ts unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts)
		if byteorder.NativeEndian.Uint32(v[8:]) != 0 {
			t.Fatalf("host view flags %#x, want 0 (a view the filter covers)", byteorder.NativeEndian.Uint32(v[8:]))
		}
		return time.Duration(byteorder.NativeEndian.Uint64(v[:])) - time.Duration(ts.Nano())
	}
	// Renewed: still trusted well past the first view's time. Polled, so
	// that a machine too busy to renew on time for a moment passes.
	time.Sleep(time.Second)
	eventually(t, "the host view is renewed", func() (bool, string) {
		left := validUntil()
		return left > 0, left.String()
	})

	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the daemon did not exit on SIGTERM")
	}
	if left := validUntil(); left > 0 {
		t.Errorf("after the daemon stopped, the host view is trusted for %v more, want revoked", left)
	}
}
