package integration

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// addKilledAfter runs the built plugin's ADD as a runtime does and SIGKILLs
// it after d, as an OOM kill or a node agent would. It reports whether the
// ADD finished first, successfully.
func (h *cniHost) addKilledAfter(t *testing.T, container string, conf []byte, d time.Duration) bool {
	t.Helper()
	return h.killedAfter(t, "ADD", container, conf, d)
}

// killedAfter runs command (ADD, DEL) and SIGKILLs it after d; it reports
// whether the command finished first, successfully.
func (h *cniHost) killedAfter(t *testing.T, command, container string, conf []byte, d time.Duration) bool {
	t.Helper()
	cmd := h.command(command, container, conf)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err == nil
	case <-time.After(d):
		_ = cmd.Process.Kill()
		return <-done == nil
	}
}

// TestAnAddKilledAnywhereLeavesNothingAfterItsDelRetry kills the built
// plugin's ADD at random points, many times, then does what a runtime does:
// DEL the sandbox again until it succeeds; then kills DELs of half the
// finished ones at random points and retries them. The node must end with exactly the taps, rows and records of
// the ADDs that finished: a tap made persistent before it was stamped is
// one no DEL, GC or reclaim would ever remove.
func TestAnAddKilledAnywhereLeavesNothingAfterItsDelRetry(t *testing.T) {
	h := newCNIHost(t)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 26))
	const adds = 120
	finished := map[string]bool{} // tap name → the ADD finished
	containers := map[string]string{}
	for i := range adds {
		att := identity.Attachment(100 + i).Base62()
		ctr := fmt.Sprintf("%064d", i)
		containers[tapName(att)] = ctr
		d := time.Duration(rng.IntN(40_000)) * time.Microsecond
		if h.addKilledAfter(t, ctr, h.conf(att, nil), d) {
			finished[tapName(att)] = true
			continue
		}
		// The runtime's retried DEL of a sandbox whose ADD died.
		if _, err := h.cni("DEL", ctr, h.conf(att, nil)); err != nil {
			t.Fatalf("DEL retry after ADD %d was killed after %s: %v", i, d, err)
		}
	}
	// Half the finished ones are deleted, each DEL killed at a random
	// point and retried as the runtime does.
	for name := range finished {
		if rng.IntN(2) == 0 {
			continue
		}
		id, err := identity.ParseTapName(name)
		if err != nil {
			t.Fatal(err)
		}
		conf := h.conf(id.Attachment.Base62(), nil)
		h.killedAfter(t, "DEL", containers[name], conf, time.Duration(rng.IntN(30_000))*time.Microsecond)
		if _, err := h.cni("DEL", containers[name], conf); err != nil {
			t.Fatalf("DEL retry after a killed DEL of %s: %v", name, err)
		}
		delete(finished, name)
	}
	var live []string
	for name := range finished {
		live = append(live, name)
	}
	sort.Strings(live)
	t.Logf("%d of %d ADDs finished before their kill", len(live), adds)

	// What is on the node: every tenant tap, every registration, every record.
	var taps []string
	for _, l := range linksOf(t, h) {
		if strings.HasPrefix(l, "G00000000a") && strings.HasSuffix(l, "H") {
			taps = append(taps, l)
		}
	}
	sort.Strings(taps)
	if strings.Join(taps, " ") != strings.Join(live, " ") {
		t.Fatalf("taps on the node:\n%v\nwant exactly the finished ADDs':\n%v", taps, live)
	}
	if regs := registrations(t, h); len(regs) != len(live) {
		t.Fatalf("%d interfaces have rows, want %d: %+v", len(regs), len(live), regs)
	}
	records, _ := filepath.Glob(filepath.Join(h.dataDir, "galactic", "G*"))
	if len(records) != len(live) {
		t.Fatalf("%d records, want %d: %v", len(records), len(live), records)
	}
	for _, name := range live {
		if _, err := os.Stat(filepath.Join(h.dataDir, "galactic", name)); err != nil {
			t.Fatalf("the finished ADD of %s has no record: %v", name, err)
		}
	}
}

// linksOf lists the names of the host namespace's links.
func linksOf(t *testing.T, h *cniHost) []string {
	t.Helper()
	out, err := exec.Command("ip", "-n", h.host.Name, "-o", "link", "show").Output()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 {
			names = append(names, strings.TrimSuffix(strings.SplitN(f[1], "@", 2)[0], ":"))
		}
	}
	return names
}

// TestADelRemovesAnUnstampedTapOfItsIdentityOnlyWhenFree: earlier plugins
// made a tap persistent before stamping it, so an ADD killed in between left
// an unstamped tap. The DEL retry of that identity removes it when nothing
// holds it, and keeps it when something does.
func TestADelRemovesAnUnstampedTapOfItsIdentityOnlyWhenFree(t *testing.T) {
	h := newCNIHost(t)
	free, held := tapName("u"), tapName("v")
	nettest.NewTap(t, h.host, free, tun.Mode{})
	nettest.NewTap(t, h.host, held, tun.Mode{SingleQueue: true})
	nettest.HoldInFlight(t, h.host, held, tun.Mode{SingleQueue: true})
	h.host.IP(t, "link", "set", held, "carrier", "off")
	h.mustCNI("DEL", ctrA, h.conf("u", nil))
	h.mustCNI("DEL", ctrA, h.conf("v", nil))
	if _, ok := h.link(free); ok {
		t.Fatal("DEL left the unstamped, unheld tap of its identity")
	}
	if _, ok := h.link(held); !ok {
		t.Fatal("DEL removed an unstamped tap that a file holds")
	}
}

// TestANewTapHasNoQueueingDiscipline: the kernel gives each of a
// multiqueue tap's 256 transmit queues a default qdisc when it first goes
// up, about 6.5 MiB of kernel memory per tap (BenchmarkKernelMemoryPerTap).
// The plugin makes noqueue the root qdisc before that.
func TestANewTapHasNoQueueingDiscipline(t *testing.T) {
	h := newCNIHost(t)
	h.mustCNI("ADD", ctrA, h.conf("q", nil))
	out := nettest.Run(t, "tc", "-n", h.host.Name, "qdisc", "show", "dev", tapName("q"))
	if !strings.Contains(out, "qdisc noqueue") || strings.Contains(out, "pfifo_fast") {
		t.Fatalf("the plugin's tap has qdiscs:\n%s", out)
	}
}
