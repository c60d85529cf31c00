package cnitap

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/vrf"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// killedWriterEnv, set in a child of the test binary, names the folder
// TestHelperKilledWriter writes a record into and dies in.
const killedWriterEnv = "GALACTIC_TEST_KILLED_WRITER_DIR"

// TestHelperKilledWriter is no test: run by killWriter in a child process,
// it writes a record and SIGKILLs itself between CreateTemp and Rename.
func TestHelperKilledWriter(t *testing.T) {
	dir := os.Getenv(killedWriterEnv)
	if dir == "" {
		t.Skip("a helper process of killWriter")
	}
	killAfterCreateTemp()
	err := writeRecord(dir, os.Getenv(killedWriterEnv+"_NETWORK"), record{Tap: os.Getenv(killedWriterEnv + "_TAP"), ContainerID: "killed"})
	t.Fatalf("writeRecord returned (%v) instead of being killed", err)
}

// killWriter runs writeRecord of tap in network in a child process that is
// SIGKILLed between its CreateTemp and its Rename, and returns the temp
// file it left.
func killWriter(t *testing.T, dataDir, network, tap string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperKilledWriter$", "-test.count=1")
	cmd.Env = append(os.Environ(), killedWriterEnv+"="+dataDir, killedWriterEnv+"_NETWORK="+network, killedWriterEnv+"_TAP="+tap)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the writer was not killed: %v\n%s", err, out)
	}
	temps := tempsOf(t, filepath.Join(dataDir, network))
	if len(temps) != 1 {
		t.Fatalf("the killed writer left %v, want one temp file", temps)
	}
	return temps[0]
}

func tempsOf(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, ".tmp-*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// A plugin SIGKILLed between writeRecord's CreateTemp and its Rename
// leaves a temp file every reader skips; a network whose config is gone
// then keeps its folder forever, since rmdir fails on it. The collection
// removes such a file under its tap's VPC lock, and the empty folder with it;
// one younger than minTempAge it leaves, in case the daemon's lock is not
// the plugin's.
func TestTheCollectionRemovesATempFileOfAKilledWriter(t *testing.T) {
	ns := nettest.NewNS(t)
	dataDir := filepath.Join(t.TempDir(), "records")
	locks, err := vrf.NewLocker(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tap := identity.Identity{VPC: 1, Attachment: 2}.TapName()
	temp := killWriter(t, dataDir, "gone", tap)
	// The collection leaves a temp file younger than a minute: see
	// minTempAge. A killed writer's is older by the time it looks again.
	old := time.Now().Add(-2 * time.Minute)
	if err := os.Chtimes(temp, old, old); err != nil {
		t.Fatal(err)
	}
	young := killWriter(t, dataDir, "young", tap)
	var logs bytes.Buffer
	_, err = CollectRecords(context.Background(), dataDir, ns.Dial(t), locks, time.Second, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(temp); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the killed writer's temp file is left (%v):\n%s", err, logs.String())
	}
	if _, err := os.Stat(filepath.Join(dataDir, "gone")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the gone network's folder is left (%v):\n%s", err, logs.String())
	}
	if _, err := os.Stat(young); err != nil {
		t.Errorf("a temp file younger than minTempAge is gone: %v", err)
	}
}
