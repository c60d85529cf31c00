package cnitap

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/node/vrf"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// recordScene is a test's "host" namespace with records of its taps: some
// live, some gone, some written before records named their namespace.
type recordScene struct {
	host    *nettest.NS
	hostID  string
	dataDir string
	locks   *vrf.Locker
	// by what the record is
	live, gone, legacyLive, legacyGone, legacyUnseen string
}

const sceneNetwork = "n"

func newRecordScene(t *testing.T) *recordScene {
	t.Helper()
	s := &recordScene{host: nettest.NewNS(t), dataDir: filepath.Join(t.TempDir(), "records")}
	var err error
	if s.locks, err = vrf.NewLocker(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if s.hostID, err = s.host.Dial(t).NetNS(); err != nil {
		t.Fatal(err)
	}
	tapOf := func(vpc, att int) string {
		return identity.Identity{VPC: identity.VPC(vpc), Attachment: identity.Attachment(att)}.TapName()
	}
	s.live, s.gone, s.legacyLive, s.legacyGone = tapOf(1, 1), tapOf(1, 2), tapOf(1, 3), tapOf(1, 4)
	s.legacyUnseen = tapOf(2, 5) // VPC 2 has no VRF here
	// No VRF in every kernel these tests run on: a bridge of the VRF's
	// name stands in, as for the plugin (master "bridge").
	s.host.IP(t, "link", "add", identity.VPC(1).VRFName(), "type", "bridge")
	for _, tap := range []string{s.live, s.legacyLive} {
		nettest.NewTap(t, s.host, tap, tun.Mode{})
		s.host.IP(t, "link", "set", tap, "alias", "ctr-"+tap)
	}
	for _, r := range []record{
		{Tap: s.live, HostNetNS: s.hostID},
		{Tap: s.gone, HostNetNS: s.hostID},
		{Tap: s.legacyLive}, {Tap: s.legacyGone}, {Tap: s.legacyUnseen},
	} {
		r.ContainerID, r.IfName = "ctr-"+r.Tap, "eth0"
		if err := writeRecord(s.dataDir, sceneNetwork, r); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func (s *recordScene) left(t *testing.T) []string {
	t.Helper()
	recs, _, err := readRecords(s.dataDir, sceneNetwork)
	if err != nil {
		t.Fatal(err)
	}
	var taps []string
	for _, r := range recs {
		taps = append(taps, r.Tap)
	}
	slices.Sort(taps)
	return taps
}

func sorted(s ...string) []string { slices.Sort(s); return s }

// A collector that reads links in another namespace than the one the taps
// were made in sees none of them, live or gone: it must remove no record,
// and say why, naming both namespaces. This is a daemon started in a
// private namespace over the host's record folder.
func TestACollectorInAnotherNamespaceRemovesNoRecord(t *testing.T) {
	s := newRecordScene(t)
	away := nettest.NewNS(t)
	links := away.Dial(t)
	awayID, err := links.NetNS()
	if err != nil {
		t.Fatal(err)
	}
	before := s.left(t)
	var logs bytes.Buffer
	res, err := CollectRecords(context.Background(), s.dataDir, links, s.locks, time.Second, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.left(t); len(res.Collected) != 0 || !slices.Equal(got, before) {
		t.Fatalf("collected %v from another namespace; records left %v, want all of %v", res.Collected, got, before)
	}
	if res.Unjudged != len(before) {
		t.Errorf("Unjudged = %d, want %d", res.Unjudged, len(before))
	}
	for _, want := range []string{"2 records were written in network namespace " + s.hostID, "this collector is in " + awayID,
		"3 records were written without their network namespace", identity.VPC(1).VRFName(), "not its to judge"} {
		if !strings.Contains(res.UnjudgedWhy, want) {
			t.Errorf("UnjudgedWhy %q does not say %q", res.UnjudgedWhy, want)
		}
	}
	if n := strings.Count(logs.String(), "level=WARN msg=\"records left unjudged"); n != 1 {
		t.Errorf("warned %d times, want once:\n%s", n, logs.String())
	}
}

// In the namespace the taps were made in, the collector removes the record
// of a gone tap that names that namespace, and one that names none when
// the tap's VRF is there to show it is the namespace; it keeps the records
// of live taps, and one naming no namespace whose VRF it does not see.
func TestACollectorInTheTapsNamespaceRemovesTheRecordsOfGoneTaps(t *testing.T) {
	s := newRecordScene(t)
	res, err := CollectRecords(context.Background(), s.dataDir, s.host.Dial(t), s.locks, time.Second, quiet())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.left(t), sorted(s.live, s.legacyLive, s.legacyUnseen); !slices.Equal(got, want) {
		t.Errorf("records left %v, want %v", got, want)
	}
	var collected []string
	for _, c := range res.Collected {
		collected = append(collected, c.Tap)
		if c.Why != "tap gone" {
			t.Errorf("collected %s because %q, want tap gone", c.Tap, c.Why)
		}
	}
	if want := sorted(s.gone, s.legacyGone); !slices.Equal(sorted(collected...), want) {
		t.Errorf("collected %v, want %v", collected, want)
	}
	if res.Unjudged != 1 || !strings.Contains(res.UnjudgedWhy, identity.VPC(2).VRFName()) {
		t.Errorf("Unjudged %d %q, want the one record of VPC 2, whose VRF is not here", res.Unjudged, res.UnjudgedWhy)
	}
	if _, err := os.Stat(filepath.Join(s.dataDir, sceneNetwork)); errors.Is(err, os.ErrNotExist) {
		t.Error("the folder of records still kept is gone")
	}
}
