package holder_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/datum-cloud/galactic-node/internal/nettest"
	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/node/tun/holder"
)

func readTap(t *testing.T, c *link.Conn, name string) link.Tap {
	t.Helper()
	l, err := c.GetByName(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	tp, ok := l.AsTap()
	if !ok {
		t.Fatalf("%s is not a tenant tap", name)
	}
	return tp
}

// TestAScanOfProcFindsTheHolderOfASingleQueueTap runs the real scan over
// /proc: a child process holding a single-queue tap whose carrier was forced
// off is found by its PID, and the tap reads held; once it exits, a complete
// scan proves the tap free.
func TestAScanOfProcFindsTheHolderOfASingleQueueTap(t *testing.T) {
	nettest.RequirePrivileged(t)
	ns := nettest.NewNS(t)
	c := ns.Dial(t)
	name := identity.Identity{VPC: 62, Attachment: 66}.TapName()
	nettest.NewTap(t, ns, name, tun.Mode{SingleQueue: true})
	h := nettest.Hold(t, ns, name, nettest.HoldOptions{Mode: tun.Mode{SingleQueue: true}})
	ns.IP(t, "link", "set", name, "carrier", "off")

	ctx := context.Background()
	proc := holder.Proc{Root: "/proc"}
	scan := proc.Scan(ctx)
	if ok, why := scan.Complete(); !ok {
		t.Fatalf("the scan from this PID namespace is incomplete: %s (tests run in the initial one)", why)
	}
	hs := scan.Holders(name)
	if len(hs) != 1 || hs[0].PID != h.PID() || hs[0].Command != "sleep" {
		t.Fatalf("holders of %s = %+v, want pid %d (sleep)", name, hs, h.PID())
	}
	tp := readTap(t, c, name)
	if tp.Carrier == nil || *tp.Carrier {
		t.Fatal("scene: carrier is not off")
	}
	if held, why := holder.NewJudge(proc).Held(ctx, tp); !held || !strings.Contains(why, "pid") {
		t.Fatalf("Held = %v (%s), want held by the child", held, why)
	}
	h.Release()
	if held, why := holder.NewJudge(proc).Held(ctx, readTap(t, c, name)); held {
		t.Fatalf("Held after the holder exited = true (%s)", why)
	}
}

// TestAScanOutsideTheInitialPIDNamespaceProvesNothing: a procfs whose
// self/ns/pid is not the initial namespace's cannot see every process.
func TestAScanOutsideTheInitialPIDNamespaceProvesNothing(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "self", "ns"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "self", "ns", "pid"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ok, why := holder.Proc{Root: root}.Scan(context.Background()).Complete()
	if ok || !strings.Contains(why, "initial PID namespace") {
		t.Fatalf("Complete = %v (%s), want incomplete naming the PID namespace", ok, why)
	}
	if ok, _ := (holder.Scan{}).Complete(); ok {
		t.Fatal("the zero Scan is complete")
	}
}
