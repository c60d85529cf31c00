package kubeinventory

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
)

func TestMain(m *testing.M) {
	code := clustertest.Main(m)
	if unvalidated != nil {
		_ = unvalidated.Env.Stop()
	}
	os.Exit(code)
}

var (
	unvalidatedOnce sync.Once
	unvalidated     *clustertest.Cluster
)

// unvalidatedShared is the package's second cluster, whose CRDs carry no
// admission rules, as another system's CRDs would: there a tenant can write
// an identity the daemon cannot read, which the tests of malformed objects
// need. The shipped CRDs refuse such values (integration/admission_test.go).
func unvalidatedShared(t *testing.T) *clustertest.Cluster {
	t.Helper()
	unvalidatedOnce.Do(func() { unvalidated = clustertest.StartUnvalidated(t) })
	if unvalidated == nil {
		t.Skip("the unvalidated cluster did not start (see the first test that asked for it)")
	}
	return unvalidated
}

func start(t *testing.T, cluster *clustertest.Cluster) *Cluster {
	t.Helper()
	c, _ := startWith(t, cluster, Options{}, nil)
	return c
}

func clean(t *testing.T, cluster *clustertest.Cluster) {
	t.Helper()
	cluster.DeleteAll(t, AttachmentResource)
	cluster.DeleteAll(t, AdvertisementResource)
	t.Cleanup(func() {
		cluster.DeleteAll(t, AttachmentResource)
		cluster.DeleteAll(t, AdvertisementResource)
	})
}

// setStatus rewrites a VPCAttachment's identity through its status.
func setStatus(t *testing.T, cluster *clustertest.Cluster, ns, name, vpc, att string) {
	t.Helper()
	ri := cluster.Client.Resource(AttachmentResource).Namespace(ns)
	u, err := ri.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u.Object["status"].(map[string]any)["vpc"] = vpc
	u.Object["status"].(map[string]any)["vpcAttachment"] = att
	if _, err := ri.UpdateStatus(context.Background(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// eventually waits until ok holds of a snapshot.
func eventually(t *testing.T, c *Cluster, what string, ok func(s *inventory.Snapshot) bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s := c.Snapshot(context.Background())
		if ok(&s) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("never: %s (identities %d, attachments %d, malformed %d %v)", what, s.Identities(), s.Attachments, s.Malformed(), s.MalformedSample)
		}
	}
}

func carriedBy(id identity.Identity, refs ...inventory.ObjectRef) func(s *inventory.Snapshot) bool {
	return func(s *inventory.Snapshot) bool {
		got := slices.SortedFunc(slices.Values(s.Carriers(id)), compareRef)
		return slices.Equal(got, refs)
	}
}

func compareRef(a, b inventory.ObjectRef) int {
	switch {
	case a.String() < b.String():
		return -1
	case a.String() > b.String():
		return 1
	}
	return 0
}

// TestSnapshotFollowsEachEvent creates, re-identifies and deletes
// attachments and advertisements and checks the carriers after each.
func TestSnapshotFollowsEachEvent(t *testing.T) {
	cluster := unvalidatedShared(t)
	clean(t, cluster)
	c := start(t, cluster)
	id1, id2, id3 := identity.Identity{VPC: 101, Attachment: 1}, identity.Identity{VPC: 101, Attachment: 2}, identity.Identity{VPC: 0x3e, Attachment: 0x41}
	a := inventory.ObjectRef{Kind: inventory.AttachmentKind, Namespace: "tenant-a", Name: "web"}
	b := inventory.ObjectRef{Kind: inventory.AttachmentKind, Namespace: "tenant-b", Name: "db"}
	adv := inventory.ObjectRef{Kind: inventory.AdvertisementKind, Namespace: "node-a", Name: id3.AdvertisementName()}

	cluster.Apply(t, AttachmentResource, clustertest.Attachment(a.Namespace, a.Name, id1.VPC.Base62(), id1.Attachment.Base62()))
	eventually(t, c, "web carries id1", carriedBy(id1, a))
	cluster.Apply(t, AttachmentResource, clustertest.Attachment(b.Namespace, b.Name, id1.VPC.Base62(), id1.Attachment.Base62()))
	eventually(t, c, "web and db carry id1", carriedBy(id1, a, b))

	setStatus(t, cluster, a.Namespace, a.Name, id2.VPC.Base62(), id2.Attachment.Base62())
	eventually(t, c, "web moved to id2", func(s *inventory.Snapshot) bool {
		return carriedBy(id1, b)(s) && carriedBy(id2, a)(s) && s.Identities() == 2 && s.Attachments == 2
	})

	cluster.Apply(t, AdvertisementResource, clustertest.Advertisement(adv.Namespace, adv.Name, "node-a"))
	eventually(t, c, "advertisement carries id3", func(s *inventory.Snapshot) bool {
		return carriedBy(id3, adv)(s) && s.Advertisements == 1
	})

	setStatus(t, cluster, b.Namespace, b.Name, "zzzzzzzzzzzzzzzz", "1")
	eventually(t, c, "db malformed, denoting nothing, blocks nothing", func(s *inventory.Snapshot) bool {
		return !s.Carried(id1) && s.Malformed() == 1 && slices.Equal(s.MalformedSample, []inventory.ObjectRef{b}) && s.Healthy() == nil
	})
	setStatus(t, cluster, b.Namespace, b.Name, "", "")
	eventually(t, c, "db pending: healthy, carries nothing", func(s *inventory.Snapshot) bool {
		return s.Malformed() == 0 && s.Healthy() == nil && s.Attachments == 1
	})

	cluster.Delete(t, AttachmentResource, a.Namespace, a.Name)
	eventually(t, c, "web gone", func(s *inventory.Snapshot) bool {
		return !s.Carried(id2) && s.Attachments == 0 && s.Healthy() != nil
	})
	cluster.Delete(t, AdvertisementResource, adv.Namespace, adv.Name)
	eventually(t, c, "advertisement gone", func(s *inventory.Snapshot) bool {
		return !s.Carried(id3) && s.Identities() == 0 && s.Advertisements == 0
	})
}

// TestATombstoneDeletes: an object deleted while the watch was down comes
// back from the relist as a tombstone naming it by key.
func TestATombstoneDeletes(t *testing.T) {
	x := inventory.NewIndex()
	s := &indexStore{kind: inventory.AttachmentKind, index: x}
	o := inventory.AttachmentObject("ns", "a", "1", "2")
	if err := s.apply(cache.Delta{Type: cache.Added, Object: &cachedObject{Object: o}}); err != nil {
		t.Fatal(err)
	}
	if keys := s.ListKeys(); !slices.Equal(keys, []string{"ns/a"}) {
		t.Fatalf("keys %v", keys)
	}
	got, ok, _ := s.GetByKey("ns/a")
	if err := s.apply(cache.Delta{Type: cache.Deleted, Object: cache.DeletedFinalStateUnknown{Key: "ns/a", Obj: got}}); err != nil || !ok {
		t.Fatal(err, ok)
	}
	if snap := x.Snapshot(true, nil); snap.Identities() != 0 || len(s.ListKeys()) != 0 {
		t.Fatalf("tombstone left %d identities", snap.Identities())
	}
}

// diff says how two snapshots differ in what a pass reads, or "".
func diff(a, b *inventory.Snapshot) string {
	if a.Attachments != b.Attachments || a.Advertisements != b.Advertisements || a.Identities() != b.Identities() {
		return fmt.Sprintf("counts %d/%d/%d vs %d/%d/%d", a.Attachments, a.Advertisements, a.Identities(), b.Attachments, b.Advertisements, b.Identities())
	}
	if a.Malformed() != b.Malformed() || !slices.Equal(a.MalformedSample, b.MalformedSample) {
		return fmt.Sprintf("malformed %d %v vs %d %v", a.Malformed(), a.MalformedSample, b.Malformed(), b.MalformedSample)
	}
	for id, l := range a.All() {
		if !carriedBy(id, slices.SortedFunc(slices.Values(l), compareRef)...)(b) {
			return fmt.Sprintf("%s carried by %v vs %v", id, l, b.Carriers(id))
		}
	}
	return ""
}

// storeSnapshot is NewSnapshot over every object the store holds.
func (c *Cluster) storeSnapshot() inventory.Snapshot {
	var objs []inventory.Object
	for _, kind := range []string{inventory.AttachmentKind, inventory.AdvertisementKind} {
		for _, ref := range c.index.Refs(kind) {
			o, _ := c.index.Get(ref)
			objs = append(objs, o)
		}
	}
	return inventory.NewSnapshot(objs, true, nil)
}

// TestSnapshotMatchesNewSnapshotAfterRandomEvents runs a seeded random
// sequence of creates, identity changes (to malformed and pending too) and
// deletes against the API server, and checks every 50 events, once the
// watch has caught up with a consistent read, that the snapshot reads as
// NewSnapshot over the store's objects and over the API server's.
func TestSnapshotMatchesNewSnapshotAfterRandomEvents(t *testing.T) {
	cluster := unvalidatedShared(t)
	clean(t, cluster)
	c := start(t, cluster)
	rng := rand.New(rand.NewPCG(20, 3))
	type key struct{ kind, ns, name string }
	live := map[key]bool{}
	ids := func() identity.Identity {
		return identity.Identity{VPC: identity.VPC(1 + rng.IntN(8)), Attachment: identity.Attachment(rng.IntN(8))}
	}
	const events = 300
	for ev := 1; ev <= events; ev++ {
		id := ids()
		if rng.IntN(4) == 0 {
			k := key{inventory.AdvertisementKind, fmt.Sprintf("node-%d", rng.IntN(3)), id.AdvertisementName()}
			if live[k] {
				cluster.Delete(t, AdvertisementResource, k.ns, k.name)
			} else {
				cluster.Apply(t, AdvertisementResource, clustertest.Advertisement(k.ns, k.name, k.ns))
			}
			live[k] = !live[k]
		} else {
			k := key{inventory.AttachmentKind, fmt.Sprintf("tenant-%d", rng.IntN(3)), fmt.Sprintf("att-%d", rng.IntN(30))}
			vpc, att := id.VPC.Base62(), id.Attachment.Base62()
			switch rng.IntN(20) {
			case 0:
				vpc = "zzzzzzzzzzzzzzzz"
			case 1:
				vpc, att = "", ""
			}
			switch {
			case !live[k]:
				cluster.Apply(t, AttachmentResource, clustertest.Attachment(k.ns, k.name, vpc, att))
				live[k] = true
			case rng.IntN(3) == 0:
				cluster.Delete(t, AttachmentResource, k.ns, k.name)
				live[k] = false
			default:
				setStatus(t, cluster, k.ns, k.name, vpc, att)
			}
		}
		if ev%50 != 0 {
			continue
		}
		proof, err := c.Prove(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var last string
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			s := c.Snapshot(context.Background())
			if last = diff(&s, &proof); last == "" {
				store := c.storeSnapshot()
				if d := diff(&s, &store); d != "" {
					t.Fatalf("event %d: snapshot vs NewSnapshot over the store: %s", ev, d)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("event %d: snapshot never caught up with the API server: %s", ev, last)
			}
		}
	}
}
