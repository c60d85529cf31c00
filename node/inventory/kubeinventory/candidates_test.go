package kubeinventory

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
)

// askCounted is a Candidates source over cluster whose consistent reads
// are counted, and fail while fail is set.
func askCounted(t *testing.T, cluster *clustertest.Cluster) (c *Candidates, reads *atomic.Int64, fail *atomic.Bool) {
	t.Helper()
	reads, fail = new(atomic.Int64), new(atomic.Bool)
	cfg := rest.CopyConfig(cluster.Config)
	cfg.WrapTransport = (&readHook{before: func(*http.Request) error {
		reads.Add(1)
		if fail.Load() {
			return errors.New("partitioned")
		}
		return nil
	}}).wrap
	c, err := NewCandidates(cfg, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c, reads, fail
}

// An ask finds every object that carries an identity asked about, in
// every namespace: the attachment by its status, the advertisements by
// either spelling of their name (hex "3e-41", and base62 for names written
// before that encoding), and nothing of an identity not asked about. Its
// size counts every VPCAttachment, and it costs one read plus at most
// three for each identity, repeated or not, when the first attachment in
// key order (tenant-a/other) carries an identity.
func TestAnAskFindsTheCarriersOfTheIdentitiesAskedOnly(t *testing.T) {
	cluster := clustertest.Shared(t)
	clean(t, cluster)
	hexID := identity.Identity{VPC: 0x3e, Attachment: 0x41}   // advertised as 3e-41
	b62ID := identity.Identity{VPC: 62*62 + 1, Attachment: 2} // advertised as 101-2, its base62 name
	attID := identity.Identity{VPC: 0x77, Attachment: 5}      // an attachment in two namespaces
	other := identity.Identity{VPC: 0x77, Attachment: 6}      // carried, never asked about
	cluster.Apply(t, AttachmentResource, clustertest.Attachment("tenant-a", "web", attID.VPC.Base62(), attID.Attachment.Base62()))
	cluster.Apply(t, AttachmentResource, clustertest.Attachment("tenant-b", "web", attID.VPC.Base62(), attID.Attachment.Base62()))
	cluster.Apply(t, AttachmentResource, clustertest.Attachment("tenant-a", "other", other.VPC.Base62(), other.Attachment.Base62()))
	cluster.Apply(t, AttachmentResource, clustertest.Attachment("tenant-a", "pending", "", ""))
	cluster.Apply(t, AdvertisementResource, clustertest.Advertisement("routers", hexID.AdvertisementName(), "node-a"))
	cluster.Apply(t, AdvertisementResource, clustertest.Advertisement("routers", "101-2", "node-b"))

	c, reads, _ := askCounted(t, cluster)
	asked := []identity.Identity{hexID, b62ID, attID, attID, {VPC: 9, Attachment: 9}}
	s, err := c.Ask(context.Background(), asked)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Healthy(); err != nil {
		t.Fatalf("asked snapshot not healthy: %v", err)
	}
	for _, id := range []identity.Identity{hexID, b62ID, attID} {
		if !s.Carried(id) {
			t.Errorf("%s not carried; carriers %v", id, s.Carriers(id))
		}
	}
	if got := s.Carriers(attID); len(got) != 2 {
		t.Errorf("carriers of %s: %v, want both namespaces' attachments", attID, got)
	}
	if s.Carried(other) || s.Carried(identity.Identity{VPC: 9, Attachment: 9}) {
		t.Errorf("an identity not asked about, or carried by nothing, is carried")
	}
	if s.Identities() != 4 {
		t.Errorf("size %d, want the 4 VPCAttachments", s.Identities())
	}
	// 4 distinct identities: at most 1 + 3×4 reads (a name whose two
	// spellings agree, or cannot be an object's name, is read once).
	if n := reads.Load(); n > 1+3*4 {
		t.Errorf("%d reads, want at most %d", n, 1+3*4)
	}
	if snap := c.Snapshot(context.Background()); snap.Healthy() != nil || snap.Identities() != 4 || snap.Carried(attID) {
		t.Errorf("Snapshot after an ask: healthy %v, size %d, carried %v: want healthy, size 4, carrying nothing",
			snap.Healthy(), snap.Identities(), snap.Carried(attID))
	}
	if c.ProvenAt().IsZero() {
		t.Error("an ask that succeeded did not move ProvenAt")
	}
}

// A cluster where no VPCAttachment carries an identity (the CRD deleted
// and reinstalled, every object gone) is not healthy: the ask says so,
// as the informers' snapshot would. Fails if the carrying read is deleted.
func TestAnAskOfAClusterWithNoIdentityIsNotHealthy(t *testing.T) {
	cluster := clustertest.Shared(t)
	clean(t, cluster)
	cluster.Apply(t, AttachmentResource, clustertest.Attachment("tenant-a", "pending", "", ""))
	c, _, _ := askCounted(t, cluster)
	s, err := c.Ask(context.Background(), []identity.Identity{{VPC: 1, Attachment: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(s.Healthy(), inventory.ErrNoAttachmentCarries) {
		t.Fatalf("Healthy() = %v, want ErrNoAttachmentCarries", s.Healthy())
	}
}

// Where the attachment the size read returns (the first in key order)
// has no identity yet, the ask reads health apart and finds the
// attachment that carries one: a cluster with an identity is healthy
// whatever its first object. Fails if the health read is dropped (the
// snapshot would be unhealthy) or always made (one read too many).
func TestAnAskWhoseFirstAttachmentHasNoIdentityReadsHealthApart(t *testing.T) {
	cluster := clustertest.Shared(t)
	clean(t, cluster)
	cluster.Apply(t, AttachmentResource, clustertest.Attachment("aaa-first", "pending", "", ""))
	cluster.Apply(t, AttachmentResource, clustertest.Attachment("tenant-a", "web", "1", "1"))
	c, reads, _ := askCounted(t, cluster)
	s, err := c.Ask(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Healthy(); err != nil {
		t.Fatalf("Healthy() = %v, want healthy: tenant-a/web carries 1-1", err)
	}
	if n := reads.Load(); n != 2 {
		t.Errorf("%d reads, want 2: the size read and the health read apart", n)
	}

	// The first attachment carries an identity now: one read says both.
	clean(t, cluster)
	cluster.Apply(t, AttachmentResource, clustertest.Attachment("tenant-a", "web", "1", "1"))
	cluster.Apply(t, AttachmentResource, clustertest.Attachment("tenant-b", "pending", "", ""))
	reads.Store(0)
	if s, err = c.Ask(context.Background(), nil); err != nil || s.Healthy() != nil || s.Identities() != 2 {
		t.Fatalf("Ask: %v, healthy %v, size %d: want healthy, size 2", err, s.Healthy(), s.Identities())
	}
	if n := reads.Load(); n != 1 {
		t.Errorf("%d reads, want 1: the size read's attachment carries an identity", n)
	}
}

// A failed read fails the whole ask, wrapped as not proven current, and
// the source's Snapshot says so until a read succeeds: nothing may rest on
// a partial answer.
func TestAFailedAskProvesNothing(t *testing.T) {
	cluster := clustertest.Shared(t)
	clean(t, cluster)
	cluster.Apply(t, AttachmentResource, clustertest.Attachment("tenant-a", "web", "1", "1"))
	c, _, fail := askCounted(t, cluster)
	fail.Store(true)
	if _, err := c.Ask(context.Background(), []identity.Identity{{VPC: 1, Attachment: 1}}); !errors.Is(err, inventory.ErrNotProvenCurrent) {
		t.Fatalf("Ask while partitioned: %v, want ErrNotProvenCurrent", err)
	}
	if snap := c.Snapshot(context.Background()); snap.Healthy() == nil {
		t.Fatal("Snapshot healthy after a failed ask")
	}
	if !c.ProvenAt().IsZero() {
		t.Fatal("a failed ask moved ProvenAt")
	}
	fail.Store(false)
	if _, err := c.Ask(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if snap := c.Snapshot(context.Background()); snap.Healthy() != nil {
		t.Fatalf("Snapshot after a read succeeded again: %v", snap.Healthy())
	}
}

// The names an identity's advertisements can have: hex always, base62
// where it differs and can be an object's name.
func TestAdvertisementNames(t *testing.T) {
	for _, c := range []struct {
		id   identity.Identity
		want []string
	}{
		{identity.Identity{VPC: 1, Attachment: 1}, []string{"1-1"}},
		{identity.Identity{VPC: 0x3e, Attachment: 0x41}, []string{"3e-41", "10-13"}},
		{identity.Identity{VPC: 36, Attachment: 0}, []string{"24-0"}}, // base62 "A-0": upper case, no object's name
	} {
		if got := AdvertisementNames(c.id); !slices.Equal(got, c.want) {
			t.Errorf("AdvertisementNames(%s) = %q, want %q", c.id, got, c.want)
		}
	}
	for _, id := range []identity.Identity{{VPC: 0x3e, Attachment: 0x41}, {VPC: identity.MaxVPC, Attachment: identity.MaxAttachment}} {
		for _, name := range AdvertisementNames(id) {
			ids, err := identity.ParseAdvertisementName(name)
			if err != nil || !slices.Contains(ids, id) {
				t.Errorf("%q reads as %v, %v: not %s", name, ids, err, id)
			}
		}
	}
}
