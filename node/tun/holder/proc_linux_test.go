package holder_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/node/tun/holder"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

func readTap(t testing.TB, c *link.Conn, name string) link.Tap {
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

// TestHeldFollowsTheKernelTable walks a tap through every state of the
// docs/kernel.md table, single-queue and multiqueue, and checks Held in each.
// A held single-queue tap with carrier forced off reads free here: the
// attributes cannot tell, and the removal's probe decides
// (TestAScanOfProcFindsTheHolderOfASingleQueueTap).
func TestHeldFollowsTheKernelTable(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode tun.Mode
	}{{"multiqueue", tun.Mode{}}, {"single-queue", tun.Mode{SingleQueue: true}}} {
		t.Run(tc.name, func(t *testing.T) {
			ns := nettest.NewNS(t)
			c := ns.Dial(t)
			name := identity.Identity{VPC: 62, Attachment: 65}.TapName()
			nettest.NewTap(t, ns, name, tc.mode)

			check := func(state string, want bool) {
				t.Helper()
				tap := readTap(t, c, name)
				if got, _ := holder.Held(tap); got != want {
					t.Errorf("%s: Held() = %v, want %v (tun %+v, carrier %v)", state, got, want, tap.Tun, *tap.Carrier)
				}
			}
			check("persistent, no fd open", false)
			ns.IP(t, "link", "set", name, "up")
			check("no fd, administratively up", false)

			h := nettest.Hold(t, ns, name, nettest.HoldOptions{Mode: tc.mode})
			check("one fd held by another process", true)
			ns.IP(t, "link", "set", name, "down")
			check("held, administratively down", true)
			if tc.mode.SingleQueue {
				ns.IP(t, "link", "set", name, "carrier", "off")
				check("held, carrier forced off", false)
			}
			h.Release()
			check("fd closed again", false)

			if tc.mode.SingleQueue {
				return
			}
			h = nettest.Hold(t, ns, name, nettest.HoldOptions{Queues: 2})
			check("two fds attached", true)
			h.Release()
			h = nettest.Hold(t, ns, name, nettest.HoldOptions{Queues: 2, Detached: 1})
			check("one of two queues detached, fds open", true)
			h.Release()
			h = nettest.Hold(t, ns, name, nettest.HoldOptions{Queues: 1, Detached: 1})
			tap := readTap(t, c, name)
			if a, d, ok := tap.Tun.QueueCounts(); !ok || a != 0 || d != 1 {
				t.Errorf("only a detached queue open: counts %d/%d ok=%v, want 0/1", a, d, ok)
			}
			check("only a detached queue open", true)
			h.Release()
			check("fd closed again after detach", false)
		})
	}
}

// TestAScanOfProcFindsTheHolderOfASingleQueueTap runs the real scan over
// /proc: a child process holding a single-queue tap whose carrier was forced
// off is found by its PID. The attributes alone cannot call the tap held;
// the kernel's probe does, and after the holder exits it claims the tap.
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
		requireUnreadableByRoot(t, why)
	}
	hs := scan.Holders(name)
	if len(hs) != 1 || hs[0].PID != h.PID() || hs[0].Command != "sleep" {
		t.Fatalf("holders of %s = %+v, want pid %d (sleep)", name, hs, h.PID())
	}
	tp := readTap(t, c, name)
	if tp.Carrier == nil || *tp.Carrier {
		t.Fatal("scene: carrier is not off")
	}
	if held, why := holder.Held(tp); held {
		t.Fatalf("Held = true (%s): carrier off on a single-queue tap should leave it to the probe", why)
	}
	prober := holder.Prober{NS: ns.File, Links: c}
	if claim, err := prober.Claim(ctx, tp); !errors.Is(err, holder.ErrHeld) {
		claim.Release()
		t.Fatalf("Claim of a held tap = %v, want ErrHeld", err)
	}
	h.Release()
	claim, err := prober.Claim(ctx, readTap(t, c, name))
	if err != nil {
		t.Fatalf("Claim after the holder exited: %v", err)
	}
	if f, err := tun.Open(ns.File, name, tun.Mode{SingleQueue: true}); !errors.Is(err, unix.EBUSY) {
		if err == nil {
			f.Close()
		}
		t.Fatalf("a second attach while claimed = %v, want EBUSY", err)
	}
	claim.Release()
	if tp := readTap(t, c, name); !tp.Tun.Persist || *tp.Carrier {
		t.Fatalf("after the claim: persist %v carrier %v, want the tap as it was", tp.Tun.Persist, *tp.Carrier)
	}
}

// TestAProbeOfAMultiqueueTapCountsTheQueues: a multiqueue tap takes many
// files, so the claim proves it free only when its own queue is the only
// one; an attach after the claim shows as another holder.
func TestAProbeOfAMultiqueueTapCountsTheQueues(t *testing.T) {
	nettest.RequirePrivileged(t)
	ns := nettest.NewNS(t)
	c := ns.Dial(t)
	ctx := context.Background()
	name := identity.Identity{VPC: 62, Attachment: 67}.TapName()
	nettest.NewTap(t, ns, name, tun.Mode{})
	prober := holder.Prober{NS: ns.File, Links: c}
	claim, err := prober.Claim(ctx, readTap(t, c, name))
	if err != nil {
		t.Fatalf("Claim of a free multiqueue tap: %v", err)
	}
	defer claim.Release()
	if held, why := claim.HeldByOthers(readTap(t, c, name).Link); held {
		t.Fatalf("HeldByOthers with only the claim attached = true (%s)", why)
	}
	late := nettest.Hold(t, ns, name, nettest.HoldOptions{})
	if held, _ := claim.HeldByOthers(readTap(t, c, name).Link); !held {
		t.Fatal("HeldByOthers after a VMM attached a queue = false")
	}
	claim.Release()
	if _, err := prober.Claim(ctx, readTap(t, c, name)); !errors.Is(err, holder.ErrHeld) {
		t.Fatalf("Claim of a held multiqueue tap = %v, want ErrHeld", err)
	}
	late.Release()
}

// TestAProbeNeverLeavesATapItCreated: TUNSETIFF creates a tap of the name
// when none exists, so a probe of a tap deleted since it was read must
// report it gone and leave nothing behind.
func TestAProbeNeverLeavesATapItCreated(t *testing.T) {
	nettest.RequirePrivileged(t)
	ns := nettest.NewNS(t)
	c := ns.Dial(t)
	name := identity.Identity{VPC: 62, Attachment: 68}.TapName()
	nettest.NewTap(t, ns, name, tun.Mode{SingleQueue: true})
	tp := readTap(t, c, name)
	ns.IP(t, "link", "del", name)
	if _, err := (holder.Prober{NS: ns.File, Links: c}).Claim(context.Background(), tp); !errors.Is(err, link.ErrLinkGone) {
		t.Fatalf("Claim of a deleted tap = %v, want ErrLinkGone", err)
	}
	if _, err := c.GetByName(context.Background(), name); !errors.Is(err, link.ErrLinkGone) {
		t.Fatalf("a tap %s exists after the probe: %v", name, err)
	}
}

// scanAs runs the real scan of root in a child of this test binary whose
// capabilities are only caps (setpriv; "": all of the test's), as the daemon runs in a container,
// and returns its verdict. With hidepid, the child first mounts a procfs
// with hidepid=2,gid=4242 (a group it is not in) on root in a mount namespace of its own.
func scanAs(t *testing.T, caps string, hidepid bool) (bool, string, []holder.Holder, string) {
	t.Helper()
	args := []string{"--", os.Args[0], "-test.run=^TestScanHelperProcess$", "-test.v=false"}
	if caps != "" { // "": the test's own capabilities
		args = append([]string{"--inh-caps=-all," + caps, "--ambient-caps=-all," + caps, "--bounding-set=-all," + caps}, args...)
	}
	root := "/proc"
	if hidepid {
		root = t.TempDir()
		args = append([]string{"--mount", "--propagation", "private", "sh", "-c",
			`mount -t proc -o hidepid=2,gid=4242 proc "$0" && exec setpriv "$@"`, root}, args...)
	}
	name := "setpriv"
	if hidepid {
		name = "unshare"
	}
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "GALACTICTEST_SCAN_ROOT="+root)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("scan as %s: %v: %s", caps, err, out)
	}
	var v struct {
		Complete bool
		Why      string
		Holders  map[string][]holder.Holder
	}
	line := out
	if i := bytes.Index(out, []byte("SCAN ")); i >= 0 {
		line = out[i+5:]
		if j := bytes.IndexByte(line, '\n'); j >= 0 {
			line = line[:j]
		}
	}
	if err := json.Unmarshal(line, &v); err != nil {
		t.Fatalf("scan as %s: %v: %s", caps, err, out)
	}
	return v.Complete, v.Why, v.Holders[os.Getenv("GALACTICTEST_SCAN_TAP")], string(out)
}

// TestScanHelperProcess is scanAs's child, not a test of its own.
func TestScanHelperProcess(t *testing.T) {
	root := os.Getenv("GALACTICTEST_SCAN_ROOT")
	if root == "" {
		t.Skip("run by scanAs")
	}
	s := holder.Proc{Root: root}.Scan(context.Background())
	ok, why := s.Complete()
	tap := os.Getenv("GALACTICTEST_SCAN_TAP")
	b, _ := json.Marshal(map[string]any{"Complete": ok, "Why": why, "Holders": map[string][]holder.Holder{tap: s.Holders(tap)}})
	fmt.Printf("SCAN %s\n", b)
}

// TestAScanThatCannotReadEveryProcessSaysSo: a scan with the DaemonSet's
// capabilities cannot follow the descriptors of a process with more
// capabilities (EACCES) or open another user's fd folder, and under a
// hidepid=2 /proc does not even list them: each must report itself
// incomplete, never complete with the holder missing. With CAP_SYS_PTRACE
// and CAP_DAC_READ_SEARCH it sees the holder of another user.
func TestAScanThatCannotReadEveryProcessSaysSo(t *testing.T) {
	nettest.RequirePrivileged(t)
	ns := nettest.NewNS(t)
	name := identity.Identity{VPC: 62, Attachment: 69}.TapName()
	nettest.NewTap(t, ns, name, tun.Mode{SingleQueue: true})
	t.Setenv("GALACTICTEST_SCAN_TAP", name)
	root := nettest.Hold(t, ns, name, nettest.HoldOptions{Mode: tun.Mode{SingleQueue: true}})
	for _, tc := range []struct {
		caps, want string
		hidepid    bool
	}{
		{"+net_admin,+bpf", "CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH", false},
		{"+net_admin,+bpf,+sys_ptrace", "CAP_DAC_READ_SEARCH", false},
		{"+net_admin,+bpf", "hidepid=", true},
		{"", "hidepid=", true}, // every capability: an LSM still hides this machine's init
	} {
		ok, why, hs, out := scanAs(t, tc.caps, tc.hidepid)
		if ok || !strings.Contains(why, tc.want) {
			t.Errorf("scan with %s (hidepid %v) = complete %v (%s), want incomplete naming %q; holders %+v\n%s", tc.caps, tc.hidepid, ok, why, tc.want, hs, out)
		}
	}
	root.Release()
	other := nettest.HoldAs(t, ns, name, tun.Mode{SingleQueue: true}, 65534)
	ok, why, hs, out := scanAs(t, "+net_admin,+bpf,+sys_ptrace,+dac_read_search", false)
	if !ok {
		requireUnreadableByRoot(t, why)
	}
	if len(hs) != 1 || hs[0].PID != other.PID() {
		t.Fatalf("scan with SYS_PTRACE and DAC_READ_SEARCH = complete %v (%s), holders %+v; want pid %d\n%s", ok, why, hs, other.PID(), out)
	}
}

// requireUnreadableByRoot accepts an incomplete scan of a machine only when
// its reason is a process whose descriptors even this test, as root with
// every capability, cannot read (a sandbox's init here: an LSM or a
// capability the test lacks), and not a check the scanner made of itself.
func requireUnreadableByRoot(t *testing.T, why string) {
	t.Helper()
	var pid int
	if _, err := fmt.Sscanf(why, "pid %d ", &pid); err != nil {
		t.Fatalf("the scan with every capability is incomplete: %s", why)
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fdinfo", pid))
	for _, fd := range fds {
		if _, err = os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name())); err != nil {
			break
		}
	}
	if err == nil {
		t.Fatalf("the scan with every capability is incomplete (%s), but this test reads every descriptor of pid %d", why, pid)
	}
	t.Logf("the scan is incomplete on this machine: %s (this test cannot read it either: %v)", why, err)
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
