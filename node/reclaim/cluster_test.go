package reclaim_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/node/inventory/kubeinventory"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/reclaim"
	"github.com/datum-cloud/galactic-node/node/reclaim/reclaimmetrics"
	"github.com/datum-cloud/galactic-node/node/tap"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/node/tun/holder"
	"github.com/datum-cloud/galactic-node/node/vrf"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

func TestMain(m *testing.M) { os.Exit(clustertest.Main(m)) }

const table = 1062

// live is the identity a VPCAttachment carries in every scene, so that the
// inventory is healthy; stale identities are carried by nothing.
var live = identity.Identity{VPC: 62, Attachment: 1}

func staleID(n int) identity.Identity {
	return identity.Identity{VPC: 62, Attachment: identity.Attachment(100 + n)}
}

// faultRegistry wraps the real attachreg.Registry. It is a fault seam: a
// real map delete cannot be made to fail on demand, so a test sets fail.
type faultRegistry struct {
	*attachreg.Registry
	fail atomic.Bool
}

func (f *faultRegistry) UnregisterInterface(ctx context.Context, ifindex uint32) error {
	if f.fail.Load() {
		return errors.New("injected rows fault")
	}
	return f.Registry.UnregisterInterface(ctx, ifindex)
}

// faultLinks wraps the real link.Conn. It is a fault seam: the kernel cannot
// be made to refuse a delete on demand, so a test sets failDelete.
type faultLinks struct {
	*link.Conn
	failDelete atomic.Bool
}

func (f *faultLinks) DeleteGroup(ctx context.Context, group uint32) error {
	if f.failDelete.Load() {
		return errors.New("injected link fault")
	}
	return f.Conn.DeleteGroup(ctx, group)
}

func (f *faultLinks) DeleteVerified(ctx context.Context, want link.Expect) error {
	if f.failDelete.Load() {
		return errors.New("injected link fault")
	}
	return f.Conn.DeleteVerified(ctx, want)
}

type scene struct {
	t       *testing.T
	ns      *nettest.NS
	conn    *link.Conn
	taps    *tap.Manager
	dp      *datapath.Datapath
	reg     *faultRegistry
	links   *faultLinks
	lockDir string
	locks   *vrf.Locker
	metrics *reclaimmetrics.Metrics
	cluster *clustertest.Cluster
	inv     inventory.Source
	prom    *prometheus.Registry
	r       *reclaim.Reclaimer
}

// newScene builds the node side for real (netns, taps, bpffs, datapath,
// attachreg, VRF locks) against a real API server whose inventory holds one
// live attachment. inv, when given, replaces the cluster inventory.
func newScene(t *testing.T, cluster *clustertest.Cluster, inv inventory.Source) *scene {
	t.Helper()
	return newSceneIn(t, informers, cluster, inv)
}

// inventoryMode is how a scene reads the cluster: the daemon's two
// --inventory modes.
type inventoryMode string

const (
	informers  inventoryMode = "informers"
	candidates inventoryMode = "candidates"
)

// eachMode runs test once in each inventory mode: every safety rule must
// hold whichever way the node reads the cluster.
func eachMode(t *testing.T, test func(t *testing.T, mode inventoryMode)) {
	for _, m := range []inventoryMode{informers, candidates} {
		t.Run(string(m), func(t *testing.T) { test(t, m) })
	}
}

// newSceneIn is newScene with the cluster read in mode.
func newSceneIn(t *testing.T, mode inventoryMode, cluster *clustertest.Cluster, inv inventory.Source) *scene {
	t.Helper()
	nettest.RequireTCX(t) // taps are registered, which attaches the program
	s := &scene{t: t, ns: nettest.NewNS(t), cluster: cluster, lockDir: t.TempDir()}
	s.conn = s.ns.Dial(t)
	s.taps = tap.NewManager(s.ns.File, s.conn, nil)
	dp, err := datapath.Load(nettest.BPFFS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	s.dp = dp
	s.reg = &faultRegistry{Registry: attachreg.New(dp, s.ns.File, nil)}
	s.links = &faultLinks{Conn: s.conn}
	if s.locks, err = vrf.NewLocker(s.lockDir); err != nil {
		t.Fatal(err)
	}
	if cluster != nil {
		cluster.DeleteAll(t, kubeinventory.AttachmentResource)
		cluster.DeleteAll(t, kubeinventory.AdvertisementResource)
		t.Cleanup(func() {
			cluster.DeleteAll(t, kubeinventory.AttachmentResource)
			cluster.DeleteAll(t, kubeinventory.AdvertisementResource)
		})
		cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment("tenant-a", "live", live.VPC.Base62(), live.Attachment.Base62()))
	}
	waitLive := inv == nil
	if waitLive {
		inv = startInventoryIn(t, mode, cluster.Config)
	}
	s.inv = inv
	s.prom = prometheus.NewPedanticRegistry()
	if s.metrics, err = reclaimmetrics.NewMetrics(s.prom); err != nil {
		t.Fatal(err)
	}
	s.r = reclaimOver(s, s.links)
	if waitLive {
		s.waitInventory("the live attachment, synced", func(snap *inventory.Snapshot) bool { return snap.Healthy() == nil && snap.Carried(live) })
	}
	return s
}

// reclaimOver returns a reclaimer of the scene over links, scanning the
// host's processes for holders of single-queue taps.
func reclaimOver(s *scene, links reclaim.Links) *reclaim.Reclaimer {
	return reclaimWith(s, links, reclaim.Config{})
}

// reclaimWith is reclaimOver with cfg, whose lock timeout and holder
// scanner default to the scene's.
func reclaimWith(s *scene, links reclaim.Links, cfg reclaim.Config) *reclaim.Reclaimer {
	if cfg.LockTimeout == 0 {
		cfg.LockTimeout = 300 * time.Millisecond
	}
	if cfg.Prober == nil {
		cfg.Prober = holder.Prober{NS: s.ns.File, Links: links}
	}
	return reclaim.New(links, s.inv, s.reg, s.locks, s.metrics, nil, reclaim.BrakeOffUnlessSet(cfg))
}

// startInventory runs a cluster inventory over cfg until the test ends.
func startInventory(t *testing.T, cfg *rest.Config) *kubeinventory.Cluster {
	t.Helper()
	inv, err := kubeinventory.NewCluster(cfg, nil)
	return startUntilTheEnd(t, inv, err)
}

// startInventoryIn runs the inventory of mode over cfg until the test ends.
func startInventoryIn(t *testing.T, mode inventoryMode, cfg *rest.Config) inventory.Source {
	t.Helper()
	if mode == informers {
		return startInventory(t, cfg)
	}
	inv, err := kubeinventory.NewCandidates(cfg, nil, kubeinventory.Options{})
	return startUntilTheEnd(t, inv, err)
}

// startUntilTheEnd fails t on err, the error of making inv, or starts inv
// until t ends and returns it.
func startUntilTheEnd[S interface{ Start(context.Context) }](t *testing.T, inv S, err error) S {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	inv.Start(ctx)
	return inv
}

// switchable lets a test replace the inventory between passes. It is an
// inventory.Asker, so that a pass asks whatever it holds as it would ask
// that source: an Asker is asked, any other source's Snapshot stands.
type switchable struct{ inventory.Source }

func (s *switchable) Ask(ctx context.Context, ids []identity.Identity) (inventory.Snapshot, error) {
	if a, ok := s.Source.(inventory.Asker); ok {
		return a.Ask(ctx, ids)
	}
	return s.Snapshot(ctx), nil
}

func (s *switchable) ProvenAt() time.Time {
	if p, ok := s.Source.(inventory.Proven); ok {
		return p.ProvenAt()
	}
	return time.Time{}
}

func envtestUser(name string) envtest.User { return envtest.User{Name: name} }

// waitFlocked waits until another process holds an flock on path.
func waitFlocked(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		f, err := os.Open(path)
		if err == nil {
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no process took the lock on %s", path)
}

// waitInventory polls until the inventory shows what cond expects: watches
// deliver changes asynchronously.
func (s *scene) waitInventory(what string, cond func(*inventory.Snapshot) bool) {
	s.t.Helper()
	// A wait, not a timing assertion: generous for a loaded CI machine.
	deadline := time.Now().Add(60 * time.Second)
	for {
		snap := s.snapshot()
		if cond(&snap) {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("inventory never showed %s (healthy: %v)", what, snap.Healthy())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// snapshot is what the scene's inventory says now. An inventory that keeps
// no copy of the cluster is asked, as a pass would ask it, about the
// identities of the scene's taps and the live attachment's.
func (s *scene) snapshot() inventory.Snapshot {
	s.t.Helper()
	a, ok := s.inv.(inventory.Asker)
	if !ok {
		return s.inv.Snapshot(context.Background())
	}
	links, err := s.conn.Links(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	ids := []identity.Identity{live}
	for _, tp := range link.TenantTaps(links) {
		ids = append(ids, tp.Identity)
	}
	snap, err := a.Ask(context.Background(), ids)
	if err != nil {
		return inventory.Snapshot{Err: err}
	}
	return snap
}

// addTap creates and registers a tap as CNI ADD does, stamped by owner.
func (s *scene) addTap(id identity.Identity, owner string) link.Tap {
	s.t.Helper()
	return s.addTapMode(id, owner, false)
}

// addTapMode is addTap, single-queue when asked (CNI's "singleQueue": true).
func (s *scene) addTapMode(id identity.Identity, owner string, singleQueue bool) link.Tap {
	s.t.Helper()
	res, err := s.taps.Create(context.Background(), tap.Config{
		Identity: id, Owner: owner, SingleQueue: singleQueue, Master: tap.MasterBridge, Table: table, // bridge: no VRF in this kernel
		Routes: []netip.Prefix{
			netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 62, byte(id.Attachment >> 8), byte(id.Attachment)}), 32),
			netip.MustParsePrefix(fmt.Sprintf("fd00:62::%x/128", uint16(id.Attachment))),
		},
	})
	if err != nil {
		s.t.Fatal(err)
	}
	err = s.reg.RegisterInterface(context.Background(), res.Tap.Index, attachreg.Registration{
		Identity: id, Table: table, Egress: datapath.EgressTap,
		Policy:        datapath.Policy{Generation: 1, DefaultAction: datapath.ActionAllow},
		Gateway:       datapath.Gateway{IPv4: netip.MustParseAddr("10.62.0.1")},
		HostOnlyPorts: []attachreg.ProtoPort{{Protocol: datapath.ProtocolUDP, Port: 53}},
	})
	if err != nil {
		s.t.Fatal(err)
	}
	return res.Tap
}

func (s *scene) pass() reclaim.Report {
	s.t.Helper()
	rep := s.r.Pass(context.Background(), reclaim.PassOptions{})
	if rep.Result == reclaim.ResultFailed {
		s.t.Fatalf("pass failed: %s", rep.Reason)
	}
	return rep
}

func (s *scene) exists(tp link.Tap) bool {
	s.t.Helper()
	_, err := s.conn.Verify(context.Background(), link.Expect{Index: tp.Index, Name: tp.Name, Alias: tp.Alias})
	if err != nil && !errors.Is(err, link.ErrLinkGone) && !errors.Is(err, link.ErrLinkChanged) {
		s.t.Fatal(err)
	}
	return err == nil
}

func (s *scene) rowsOf(ifindex uint32) int {
	s.t.Helper()
	rows, err := s.reg.Rows(ifindex)
	if err != nil {
		s.t.Fatal(err)
	}
	n := len(rows.Rows)
	if rows.Attached {
		n++
	}
	return n
}

func (s *scene) routesVia(name string) int {
	n := 0
	for _, family := range []string{"-4", "-6"} {
		for _, line := range strings.Split(s.ns.IP(s.t, family, "route", "show", "table", "all"), "\n") {
			if strings.Contains(line, "dev "+name+" ") || strings.HasSuffix(line, "dev "+name) {
				n++
			}
		}
	}
	return n
}

func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m, labels) {
				switch {
				case m.Gauge != nil:
					return m.Gauge.GetValue()
				case m.Counter != nil:
					return m.Counter.GetValue()
				}
			}
		}
	}
	t.Fatalf("metric %s%v not found", name, labels)
	return 0
}

func matches(m *dto.Metric, labels map[string]string) bool {
	for _, lp := range m.GetLabel() {
		if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
			return false
		}
	}
	return true
}

func TestAStaleTapGoesOnTheSecondPassWithItsRowsAndRoutes(t *testing.T) {
	eachMode(t, func(t *testing.T, mode inventoryMode) {
		s := newSceneIn(t, mode, clustertest.Shared(t), nil)
		liveTap := s.addTap(live, "sandbox-live")
		stale := s.addTap(staleID(1), "sandbox-gone")
		if s.rowsOf(stale.Index) == 0 || s.routesVia(stale.Name) != 2 {
			t.Fatalf("scene: rows %d routes %d", s.rowsOf(stale.Index), s.routesVia(stale.Name))
		}
		rep := s.pass()
		if !s.exists(stale) || len(rep.Candidates) != 1 || metricValue(t, s.prom, "galactic_cni_stale_taps_pending", nil) != 1 {
			t.Fatalf("pass 1: %+v", rep)
		}
		rep = s.pass()
		if s.exists(stale) || len(rep.Reclaimed) != 1 {
			t.Fatalf("pass 2: %+v; want the stale tap gone", rep)
		}
		if n := s.rowsOf(stale.Index); n != 0 {
			t.Errorf("%d eBPF rows or attachments of the reclaimed tap remain", n)
		}
		if n := s.routesVia(stale.Name); n != 0 {
			t.Errorf("%d routes through the reclaimed tap remain", n)
		}
		if !s.exists(liveTap) || s.rowsOf(liveTap.Index) == 0 {
			t.Error("the live tap or its rows were touched")
		}
		if v := metricValue(t, s.prom, "galactic_cni_stale_taps_reclaimed_total", nil); v != 1 {
			t.Errorf("reclaimed_total = %v, want 1", v)
		}
		if v := metricValue(t, s.prom, "galactic_cni_stale_taps_pending", nil); v != 0 {
			t.Errorf("pending = %v, want 0", v)
		}
		if v := metricValue(t, s.prom, "galactic_cni_stale_tap_passes_total", map[string]string{"result": "completed"}); v != 2 {
			t.Errorf("completed passes = %v, want 2", v)
		}
		if problems, err := testutil.GatherAndLint(s.prom); err != nil || len(problems) != 0 {
			t.Errorf("metrics lint: %v %v", problems, err)
		}
	})
}

func TestTapsInUseSurviveEveryPass(t *testing.T) {
	eachMode(t, func(t *testing.T, mode inventoryMode) {
		s := newSceneIn(t, mode, clustertest.Shared(t), nil)
		cluster := s.cluster
		var keep []link.Tap

		held := s.addTap(staleID(1), "sandbox-vmm")
		nettest.Hold(t, s.ns, held.Name, nettest.HoldOptions{})
		keep = append(keep, held)

		heldDown := s.addTap(staleID(2), "sandbox-vmm-down")
		nettest.Hold(t, s.ns, heldDown.Name, nettest.HoldOptions{})
		s.ns.IP(t, "link", "set", heldDown.Name, "down")
		keep = append(keep, heldDown)

		detached := s.addTap(staleID(3), "sandbox-detached")
		nettest.Hold(t, s.ns, detached.Name, nettest.HoldOptions{Detached: 1})
		keep = append(keep, detached)

		carried := identity.Identity{VPC: 62, Attachment: 200}
		cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment("tenant-b", "web", carried.VPC.Base62(), carried.Attachment.Base62()))
		keep = append(keep, s.addTap(carried, "sandbox-web"))

		advertised := identity.Identity{VPC: 0x3e, Attachment: 0x41}
		cluster.Apply(t, kubeinventory.AdvertisementResource, clustertest.Advertisement("node-b", advertised.AdvertisementName(), "node-b"))
		keep = append(keep, s.addTap(advertised, "sandbox-moved"))

		unstamped := staleID(4)
		nettest.NewTap(t, s.ns, unstamped.TapName(), tun.Mode{})
		nettest.NewTap(t, s.ns, "eth9", tun.Mode{}) // not a tenant tap
		s.ns.IP(t, "link", "set", "eth9", "alias", "sandbox-eth9")

		s.waitInventory("the attachment and the advertisement", func(snap *inventory.Snapshot) bool {
			return snap.Carried(carried) && snap.Carried(advertised)
		})
		for i := range 4 {
			rep := s.pass()
			if len(rep.Candidates) != 0 || len(rep.Reclaimed) != 0 {
				t.Fatalf("pass %d: candidates %+v reclaimed %+v", i+1, rep.Candidates, rep.Reclaimed)
			}
		}
		for _, tp := range keep {
			if !s.exists(tp) || s.rowsOf(tp.Index) == 0 {
				t.Errorf("tap %s (%s) or its rows were removed", tp.Name, tp.Alias)
			}
		}
		for _, name := range []string{unstamped.TapName(), "eth9"} {
			if _, err := s.conn.GetByName(context.Background(), name); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	})
}

func TestARecreatedOrRestampedTapIsNotRemovedByTheNextPass(t *testing.T) {
	eachMode(t, func(t *testing.T, mode inventoryMode) {
		s := newSceneIn(t, mode, clustertest.Shared(t), nil)
		ctx := context.Background()
		a := s.addTap(staleID(1), "sandbox-1")
		b := s.addTap(staleID(2), "sandbox-2")
		s.pass()

		if err := s.taps.Delete(ctx, a.Identity, "sandbox-1"); err != nil {
			t.Fatal(err)
		}
		a2 := s.addTap(staleID(1), "sandbox-1")
		if a2.Index == a.Index {
			t.Fatal("the kernel reused the ifindex")
		}
		s.ns.IP(t, "link", "set", b.Name, "alias", "sandbox-2-again")
		b2, _ := s.conn.Get(ctx, b.Index)

		rep := s.pass()
		if len(rep.Reclaimed) != 0 || !s.exists(a2) || !s.exists(link.Tap{Link: b2}) {
			t.Fatalf("the pass after a re-create and a restamp removed: %+v", rep.Reclaimed)
		}
		if rep := s.pass(); len(rep.Reclaimed) != 2 {
			t.Fatalf("then both, stale for two passes as they are now, go: %+v", rep.Reclaimed)
		}
	})
}

func TestALateTapOrALateAttachmentIsKept(t *testing.T) {
	eachMode(t, func(t *testing.T, mode inventoryMode) {
		s := newSceneIn(t, mode, clustertest.Shared(t), nil)
		s.pass()
		late := s.addTap(staleID(1), "sandbox-late") // created after pass 1 read the links
		if rep := s.pass(); !s.exists(late) || len(rep.Confirmed) != 0 {
			t.Fatalf("a tap created after a pass read the links was confirmed by the next: %+v", rep)
		}

		comeback := s.addTap(staleID(2), "sandbox-comeback")
		s.pass() // marks it
		s.cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment("tenant-a", "comeback", comeback.Identity.VPC.Base62(), comeback.Identity.Attachment.Base62()))
		s.waitInventory("the late attachment", func(snap *inventory.Snapshot) bool { return snap.Carried(comeback.Identity) })
		rep := s.pass()
		if !s.exists(comeback) {
			t.Fatalf("a tap whose VPCAttachment appeared before the pass was removed: %+v", rep)
		}
		if s.exists(late) {
			t.Fatal("the late tap, now stale for two passes, should be gone")
		}
	})
}

// assertOnlyMarksAfter runs the healthy passes that follow an unhealthy
// one: the first must only mark, the second removes.
func assertOnlyMarksAfter(t *testing.T, s *scene, stale link.Tap) {
	t.Helper()
	if rep := s.pass(); !s.exists(stale) || len(rep.Confirmed) != 0 {
		t.Fatalf("the first healthy pass after failing inputs confirmed: %+v", rep)
	}
	if rep := s.pass(); s.exists(stale) || len(rep.Reclaimed) != 1 {
		t.Fatalf("the second healthy pass should remove: %+v", rep)
	}
}

func TestAClusterWithNoIdentityCarryingAttachmentRemovesNothing(t *testing.T) {
	eachMode(t, func(t *testing.T, mode inventoryMode) {
		s := newSceneIn(t, mode, clustertest.Shared(t), nil)
		stale := s.addTap(staleID(1), "sandbox-1")
		s.pass()
		s.cluster.Delete(t, kubeinventory.AttachmentResource, "tenant-a", "live")
		s.cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment("tenant-a", "pending", "", ""))
		s.waitInventory("no identity-carrying attachment", func(snap *inventory.Snapshot) bool { return snap.Attachments == 0 })
		for range 2 {
			if rep := s.pass(); rep.Result != reclaim.ResultSkipped || !s.exists(stale) {
				t.Fatalf("pass with no identity-carrying attachment: %+v", rep)
			}
		}
		s.cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment("tenant-a", "live", live.VPC.Base62(), live.Attachment.Base62()))
		s.waitInventory("the live attachment back", func(snap *inventory.Snapshot) bool { return snap.Carried(live) })
		assertOnlyMarksAfter(t, s, stale)
		if v := metricValue(t, s.prom, "galactic_cni_stale_tap_passes_total", map[string]string{"result": "skipped"}); v != 2 {
			t.Errorf("skipped passes = %v, want 2", v)
		}
	})
}

func TestAnInventoryNotYetSyncedRemovesNothing(t *testing.T) {
	cluster := clustertest.Shared(t)
	notStarted, err := kubeinventory.NewCluster(cluster.Config, nil)
	if err != nil {
		t.Fatal(err)
	}
	synced := &switchable{Source: notStarted}
	s := newScene(t, cluster, synced)
	stale := s.addTap(staleID(1), "sandbox-1")
	for range 2 {
		if rep := s.pass(); rep.Result != reclaim.ResultSkipped || !s.exists(stale) {
			t.Fatalf("pass on an unsynced inventory: %+v", rep)
		}
	}
	synced.Source = startInventory(t, cluster.Config)
	s.waitInventory("sync", func(snap *inventory.Snapshot) bool { return snap.Healthy() == nil })
	assertOnlyMarksAfter(t, s, stale)
}

func TestAListForbiddenByRBACRemovesNothing(t *testing.T) {
	eachMode(t, func(t *testing.T, mode inventoryMode) {
		cluster := clustertest.Shared(t)
		user, err := cluster.Env.AddUser(envtestUser("node-without-rbac"), nil)
		if err != nil {
			t.Fatal(err)
		}
		forbidden := startInventoryIn(t, mode, user.Config())
		sw := &switchable{Source: forbidden}
		s := newSceneIn(t, mode, cluster, sw)
		stale := s.addTap(staleID(1), "sandbox-1")
		deadline := time.Now().Add(10 * time.Second)
		for {
			snap := forbidden.Snapshot(context.Background())
			if err := snap.Healthy(); err != nil && strings.Contains(err.Error(), "forbidden") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("a forbidden list never showed: %v", snap.Healthy())
			}
			time.Sleep(20 * time.Millisecond)
		}
		for range 2 {
			if rep := s.pass(); rep.Result != reclaim.ResultSkipped || !s.exists(stale) || !strings.Contains(rep.Reason, "forbidden") {
				t.Fatalf("pass with a forbidden list: %+v", rep)
			}
		}
		sw.Source = startInventoryIn(t, mode, cluster.Config)
		s.waitInventory("an allowed inventory", func(snap *inventory.Snapshot) bool { return snap.Healthy() == nil })
		assertOnlyMarksAfter(t, s, stale)
	})
}

func TestAStoppedAPIServerRemovesNothing(t *testing.T) {
	eachMode(t, func(t *testing.T, mode inventoryMode) {
		cluster := clustertest.Start(t) // its own: this test stops it
		t.Cleanup(func() { _ = cluster.Env.Stop() })
		s := newSceneIn(t, mode, cluster, nil)
		stale := s.addTap(staleID(1), "sandbox-1")
		s.pass()

		apiserver := cluster.Env.ControlPlane.GetAPIServer()
		stopStart := time.Now()
		if err := apiserver.Stop(); err != nil {
			t.Fatal(err)
		}
		t.Logf("API server stopped in %v", time.Since(stopStart))
		s.waitInventory("the read failure", func(snap *inventory.Snapshot) bool { return snap.Err != nil })
		for range 2 {
			if rep := s.pass(); rep.Result != reclaim.ResultSkipped || !s.exists(stale) {
				t.Fatalf("pass with the API server stopped: %+v", rep)
			}
		}
		if err := apiserver.Start(); err != nil {
			t.Fatal(err)
		}
		s.waitInventory("reads again", func(snap *inventory.Snapshot) bool { return snap.Healthy() == nil })
		assertOnlyMarksAfter(t, s, stale)
	})
}

// A failed link delete keeps the tap exactly as it was, rows and program
// included, and the next pass removes it.
func TestALinkFailureKeepsTheTapWithItsRowsAndIsRetried(t *testing.T) {
	s := newScene(t, clustertest.Shared(t), nil)
	stale := s.addTap(staleID(1), "sandbox-1")
	before := s.rowsOf(stale.Index)
	s.pass()
	s.links.failDelete.Store(true)
	rep := s.pass()
	if !s.exists(stale) || len(rep.Failed) != 1 || rep.Failed[0].Stage != reclaim.StageLink {
		t.Fatalf("pass with a link fault: %+v", rep)
	}
	if n := s.rowsOf(stale.Index); n != before {
		t.Fatalf("the kept tap has %d rows and attachments, had %d", n, before)
	}
	if v := metricValue(t, s.prom, "galactic_cni_stale_tap_reclaim_failures_total", map[string]string{"stage": string(reclaim.StageLink)}); v != 1 {
		t.Fatalf("failures{stage=link} = %v, want 1", v)
	}
	if l, _ := s.conn.Get(context.Background(), stale.Index); l.Group != 0 {
		t.Fatalf("a kept tap was left in link group %#x", l.Group)
	}
	s.links.failDelete.Store(false)
	if rep := s.pass(); s.exists(stale) || len(rep.Reclaimed) != 1 {
		t.Fatalf("the pass after the fault cleared: %+v", rep)
	}
	if n := s.rowsOf(stale.Index); n != 0 {
		t.Fatalf("%d rows left", n)
	}
}

// The link goes before its rows: when the rows then cannot be cleared, the
// tap is gone, the failure is counted at stage rows, and what is left is
// keyed by an ifindex no link has.
func TestARowsFailureAfterTheLinkIsCounted(t *testing.T) {
	s := newScene(t, clustertest.Shared(t), nil)
	stale := s.addTap(staleID(1), "sandbox-1")
	s.pass()
	s.reg.fail.Store(true)
	rep := s.pass()
	if s.exists(stale) || len(rep.Reclaimed) != 1 || len(rep.Failed) != 1 || rep.Failed[0].Stage != reclaim.StageRows {
		t.Fatalf("pass with a rows fault: %+v", rep)
	}
	if v := metricValue(t, s.prom, "galactic_cni_stale_tap_reclaim_failures_total", map[string]string{"stage": string(reclaim.StageRows)}); v != 1 {
		t.Fatalf("failures{stage=rows} = %v, want 1", v)
	}
	if n := s.rowsOf(stale.Index); n == 0 {
		t.Fatal("the injected fault left no rows: the scene tests nothing")
	}
}

func TestAVRFLockHeldByAnotherProcessStopsTheDelete(t *testing.T) {
	s := newScene(t, clustertest.Shared(t), nil)
	stale := s.addTap(staleID(1), "sandbox-1")
	s.pass()
	lockFile := filepath.Join(s.lockDir, stale.Identity.VRFName()+".lock")
	// flock(1) holds the lock itself (-o keeps it from its child), so
	// killing it releases the lock.
	holder := exec.Command("flock", "-o", lockFile, "sleep", "3600")
	holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	release := func() {
		_ = syscall.Kill(-holder.Process.Pid, syscall.SIGKILL)
		_ = holder.Wait()
	}
	t.Cleanup(release)
	waitFlocked(t, lockFile)

	for range 2 {
		rep := s.pass()
		if !s.exists(stale) || len(rep.Failed) != 1 || rep.Failed[0].Stage != reclaim.StageLock {
			t.Fatalf("pass while another process holds the VRF lock: %+v", rep)
		}
	}
	release()
	if rep := s.pass(); s.exists(stale) || len(rep.Reclaimed) != 1 {
		t.Fatalf("after the lock was released: %+v", rep)
	}
}

// An attachment held by a finalizer still carries its identity while it is
// being deleted: its tap stays until the object is gone, then goes by the
// usual two passes. An attachment whose status is rewritten in place to
// another identity carries the new one from then on: the old identity's
// tap goes, the new one's stays, even if a pass had already marked it.
// In each inventory mode. Fails if an object being deleted counted as gone,
// or if a pass kept deciding by an identity the object no longer carries.
func TestAFinalizerAndAnIdentityEditedInPlace(t *testing.T) {
	eachMode(t, func(t *testing.T, mode inventoryMode) {
		s := newSceneIn(t, mode, clustertest.Shared(t), nil)
		ctx := context.Background()
		atts := s.cluster.Client.Resource(kubeinventory.AttachmentResource).Namespace("tenant-a")
		held, before, after := staleID(1), staleID(2), staleID(3)
		obj := clustertest.Attachment("tenant-a", "finalized", held.VPC.Base62(), held.Attachment.Base62())
		obj.SetFinalizers([]string{"example.com/hold"})
		s.cluster.Apply(t, kubeinventory.AttachmentResource, obj)
		s.cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment("tenant-a", "edited", before.VPC.Base62(), before.Attachment.Base62()))
		heldTap, beforeTap, afterTap := s.addTap(held, "sandbox-held"), s.addTap(before, "sandbox-before"), s.addTap(after, "sandbox-after")
		s.waitInventory("both attachments", func(snap *inventory.Snapshot) bool { return snap.Carried(held) && snap.Carried(before) })
		s.pass() // marks afterTap

		if err := atts.Delete(ctx, "finalized", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		setStatus(t, s.cluster, "tenant-a", "edited", after)
		s.waitInventory("the edit", func(snap *inventory.Snapshot) bool { return snap.Carried(after) && !snap.Carried(before) })
		for i := range 3 {
			rep := s.pass()
			if !s.exists(heldTap) || !s.exists(afterTap) {
				t.Fatalf("pass %d removed a tap whose attachment still carries it (finalizer pending, or edited to it): %+v", i, rep.Reclaimed)
			}
		}
		if s.exists(beforeTap) {
			t.Fatal("the tap of the identity edited away is still there after three passes")
		}

		u, err := atts.Get(ctx, "finalized", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		u.SetFinalizers(nil)
		if _, err := atts.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		s.waitInventory("the finalized attachment gone", func(snap *inventory.Snapshot) bool { return !snap.Carried(held) })
		s.pass()
		if rep := s.pass(); s.exists(heldTap) || !s.exists(afterTap) {
			t.Fatalf("once its attachment is gone, the held tap should go and the other stay: %+v", rep)
		}
	})
}

// setStatus rewrites a VPCAttachment's identity through its status.
func setStatus(t *testing.T, cluster *clustertest.Cluster, ns, name string, id identity.Identity) {
	t.Helper()
	ri := cluster.Client.Resource(kubeinventory.AttachmentResource).Namespace(ns)
	u, err := ri.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	status, _ := u.Object["status"].(map[string]any)
	status["vpc"], status["vpcAttachment"] = id.VPC.Base62(), id.Attachment.Base62()
	if _, err := ri.UpdateStatus(context.Background(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
