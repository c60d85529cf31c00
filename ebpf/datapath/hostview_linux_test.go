package datapath_test

// The host view: the node daemon's Bloom filter of the host's addresses,
// which lets the program forward every other destination without a route
// lookup. Each test runs the daemon's route watcher (node/routewatch) in the
// scene's namespace, or writes the view as a watcher that stopped left it.

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/routewatch"
)

// unroutable4 is a destination the route lookup finds no route to (a
// throw route in main ends the lookup): the program counts it the host's
// when it asks, and forwards it when the host view says it is not the
// host's. Either is safe, since the kernel delivers it to no socket; the
// difference shows which path judged a frame.
const unroutable4 = "10.205.0.9"

// judge4 writes udp/port from the VM to dst and returns what was counted.
func (s *tapScene) judge4(t *testing.T, dst string, port uint16) string {
	t.Helper()
	before := s.counts(t)
	s.write(t, udp4(brMAC, vm4, dst, 40000, port, ipv4Opts{})(nil)[0])
	return fmt.Sprint(s.counts(t).since(before))
}

func (s *tapScene) judge6(t *testing.T, dst string, port uint16) string {
	t.Helper()
	before := s.counts(t)
	s.write(t, udp6(brMAC, vm6, dst, nil, 40000, port)(nil)[0])
	return fmt.Sprint(s.counts(t).since(before))
}

// TestTheHostViewNeverForwardsAHostDestination: with the watcher's view
// trusted, every destination the host receives packets to, in any table
// the tap's lookups reach, still gets the host's rules (a default-allow
// tenant's unlisted port is denied): the host's own addresses, its subnet
// broadcast, and a local prefix (AnyIP) in another table that a rule sends
// the tap's lookups to. It fails when the filter's bits of an address or of
// a prefix are wrong or unchecked. The unroutable destination shows the
// view was in use, that the watcher renews it, and that it revokes it when
// it stops.
func TestTheHostViewNeverForwardsAHostDestination(t *testing.T) {
	s := newTapScene(t, tenant{VPC: 62, Attachment: 77})
	s.ns.IP(t, "route", "add", "throw", "10.205.0.0/16")
	s.ns.IP(t, "rule", "add", "iif", s.name, "lookup", "100", "pref", "100")
	s.ns.IP(t, "route", "add", "local", "10.202.0.0/24", "dev", "lo", "table", "100")
	s.register(t, datapath.Policy{DefaultAction: datapath.ActionAllow})

	if got := s.judge4(t, unroutable4, 9999); got != "map[deny:1]" {
		t.Fatalf("without the view, udp/9999 to %s: counted %s, want deny (the route lookup finds no route)", unroutable4, got)
	}
	_, stopWatcher := s.watchRoutes(t)
	if got := s.judge4(t, unroutable4, 9999); got != "map[allow:1]" {
		t.Fatalf("with the view, udp/9999 to %s: counted %s, want allow (outside the view, no lookup)", unroutable4, got)
	}
	for _, dst := range []string{local4, "10.0.0.255", "10.202.0.7", "127.0.0.1"} {
		if got := s.judge4(t, dst, 9999); got != "map[deny:1]" {
			t.Errorf("udp/9999 to the host's %s: counted %s, want deny", dst, got)
		}
	}
	if got := s.judge6(t, local6, 9999); got != "map[deny:1]" {
		t.Errorf("udp/9999 to the host's %s: counted %s, want deny", local6, got)
	}
	if got := s.judge4(t, far4, 9999); got != "map[allow:1]" {
		t.Errorf("udp/9999 to %s, routed away: counted %s, want allow", far4, got)
	}

	// The watcher keeps the view trusted past its first time: renewed, not
	// lapsed. A few tries, so that a machine too busy to run the renewal
	// on time for a moment does not fail the test; one that never renews
	// fails every try.
	time.Sleep(2 * routewatch.ViewTrust)
	renewed := false
	for range 50 {
		if s.judge4(t, unroutable4, 9999) == "map[allow:1]" {
			renewed = true
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !renewed {
		t.Errorf("udp/9999 to %s, %v after the view was published: never allowed, want the view renewed", unroutable4, 2*routewatch.ViewTrust)
	}

	if err := stopWatcher(); err != nil {
		t.Fatalf("watcher: %v", err)
	}
	if got := s.judge4(t, unroutable4, 9999); got != "map[deny:1]" {
		t.Errorf("after the watcher stopped, udp/9999 to %s: counted %s, want deny (the view revoked)", unroutable4, got)
	}
}

// TestAStaleHostViewIsTrustedOnlyUntilItLapses: a view that misses one of
// the host's addresses (as a killed daemon's would after an address was
// added) is trusted until its time runs out, then the route lookup answers
// again; a revoked view at once; and a view the filter cannot cover (an
// IPv6 host prefix shorter than /64) never.
func TestAStaleHostViewIsTrustedOnlyUntilItLapses(t *testing.T) {
	s := newTapScene(t, tenant{VPC: 62, Attachment: 78})
	s.register(t, datapath.Policy{DefaultAction: datapath.ActionAllow})
	stale := []netip.Prefix{netip.MustParsePrefix(gw4 + "/32")} // not local4

	if err := s.dp.PublishHostView(stale, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := s.judge4(t, local4, 9999); got != "map[allow:1]" {
		t.Fatalf("udp/9999 to %s under a view without it: counted %s, want allow (the view is trusted)", local4, got)
	}
	if err := s.dp.RevokeHostView(); err != nil {
		t.Fatal(err)
	}
	if got := s.judge4(t, local4, 9999); got != "map[deny:1]" {
		t.Errorf("udp/9999 to %s under a revoked view: counted %s, want deny", local4, got)
	}

	if err := s.dp.PublishHostView(stale, 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // and a tick of the coarse clock
	if got := s.judge4(t, local4, 9999); got != "map[deny:1]" {
		t.Errorf("udp/9999 to %s under a lapsed view: counted %s, want deny", local4, got)
	}

	partial := []netip.Prefix{stale[0], netip.MustParsePrefix("fd00:300::/48")}
	if err := s.dp.PublishHostView(partial, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := s.judge4(t, local4, 9999); got != "map[deny:1]" {
		t.Errorf("udp/9999 to %s under a view with a /48: counted %s, want deny (the filter cannot hold a /48)", local4, got)
	}
}
