package hubctl

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// One test per metric: each counts what its help text says, exactly once.

// galactic_hub_claim_releases_total: a gone network that never held a claim
// releases nothing; a kept claim counts once however often it is retried; a
// release made by the sweep is not counted here.
func TestMetricReleasesCountsEachReleaseOnce(t *testing.T) {
	s := newScene(t, 1)
	s.live("team", "a")
	mustReconcile(t, s, "team", "a")
	s.live("team", "never-claimed")
	_ = s.reconcile(t, "team", "never-claimed") // refused by the quota
	s.gone("team", "never-claimed")
	mustReconcile(t, s, "team", "never-claimed")
	if v := testutil.ToFloat64(s.m.releases.WithLabelValues(ReleaseReleased)); v != 0 {
		t.Fatalf("released = %v for a network that held no claim", v)
	}

	s.svc.policyAtBind = PolicyDelete
	s.live("team", "kept")
	s.gone("team", "a")
	mustReconcile(t, s, "team", "a")
	mustReconcile(t, s, "team", "kept")
	s.gone("team", "kept")
	for range 3 {
		_ = s.reconcile(t, "team", "kept")
	}
	for result, want := range map[string]float64{ReleaseReleased: 1, ReleaseKept: 1, ReleaseRefused: 0, ReleaseError: 0} {
		if v := testutil.ToFloat64(s.m.releases.WithLabelValues(result)); v != want {
			t.Errorf("releases{%s} = %v, want %v", result, v, want)
		}
	}

	// The sweep's release is the sweep's alone.
	s2 := newScene(t, 2)
	s2.live("team", "b")
	mustReconcile(t, s2, "team", "b")
	s2.svc.deleteNetwork("team", "b") // gone while the controller was down
	s2.c.Sweep(context.Background())
	if v := testutil.ToFloat64(s2.m.releases.WithLabelValues(ReleaseReleased)); v != 0 {
		t.Fatalf("a sweep release counted in releases too: %v", v)
	}
	if v := testutil.ToFloat64(s2.m.sweep.WithLabelValues(ReleaseReleased)); v != 1 {
		t.Fatalf("sweep released = %v, want 1", v)
	}
}

// galactic_hub_claims_release_refused: the claims currently held up, back
// to 0 when released or when the network returns.
func TestMetricReleaseRefusedGaugeTracksHeldUpClaims(t *testing.T) {
	s := newScene(t, 2)
	s.live("team", "a")
	s.live("team", "b")
	mustReconcile(t, s, "team", "a")
	mustReconcile(t, s, "team", "b")
	s.gone("team", "a")
	s.gone("team", "b")
	s.svc.deleteClaimErr = errorsJoin(ErrRefused, errInjected)
	_ = s.reconcile(t, "team", "a")
	delete(s.svc.allocations, AllocationName(platform, ClaimName("team", "b")))
	_ = s.reconcile(t, "team", "b")
	_ = s.reconcile(t, "team", "b")
	if v := testutil.ToFloat64(s.m.refused); v != 2 {
		t.Fatalf("gauge = %v with a refused and a kept claim, want 2", v)
	}
	mustReconcile(t, s, "team", "a") // the refusal is over
	if v := testutil.ToFloat64(s.m.refused); v != 1 {
		t.Fatalf("gauge = %v after a's release, want 1", v)
	}
	s.live("team", "b") // b returns and holds its claim again
	_ = s.reconcile(t, "team", "b")
	if v := testutil.ToFloat64(s.m.refused); v != 0 {
		t.Fatalf("gauge = %v after b returned, want 0", v)
	}
}

// galactic_hub_startup_sweep_claims_total: every claim looked at, once, by
// the result it met: a kept claim is kept and a refused one refused, not
// error; none of it is counted in releases.
func TestMetricSweepCountsEachClaimOnceByResult(t *testing.T) {
	for result, fault := range map[string]func(*addressService){
		ReleaseReleased: func(*addressService) {},
		ReleaseKept:     func(svc *addressService) { svc.policyAtBind = PolicyDelete },
		ReleaseRefused:  func(svc *addressService) { svc.deleteClaimErr = errorsJoin(ErrRefused, errInjected) },
		ReleaseError:    func(svc *addressService) { svc.deleteClaimErr = errInjected },
	} {
		t.Run(result, func(t *testing.T) {
			s := newScene(t, 2)
			s.live("team", "live")
			mustReconcile(t, s, "team", "live")
			fault(s.svc) // policyAtBind acts on the next bind, deleteClaimErr on the next delete
			s.live("team", "gone")
			mustReconcile(t, s, "team", "gone")
			s.svc.deleteNetwork("team", "gone") // gone while no controller ran
			m, _ := NewMetrics(prometheus.NewPedanticRegistry())
			New(s.svc, s.cache, nil, m, nil, Config{PlatformNamespace: platform}).Sweep(context.Background())
			for _, r := range []string{"live", ReleaseReleased, ReleaseKept, ReleaseRefused, ReleaseError} {
				want := 0.0
				if r == "live" || r == result {
					want = 1
				}
				if v := testutil.ToFloat64(m.sweep.WithLabelValues(r)); v != want {
					t.Errorf("sweep{%s} = %v, want %v", r, v, want)
				}
				if v := testutil.ToFloat64(m.releases.WithLabelValues(r)); r != "live" && v != 0 {
					t.Errorf("releases{%s} = %v: the sweep's result counted twice", r, v)
				}
			}
		})
	}
}

// galactic_hub_claim_quota_refusals_total: one per refused create.
func TestMetricQuotaRefusalsCountsEachRefusedCreate(t *testing.T) {
	s := newScene(t, 1)
	s.live("team", "a")
	mustReconcile(t, s, "team", "a")
	s.live("team", "b")
	for range 3 {
		_ = s.reconcile(t, "team", "b")
	}
	if v := testutil.ToFloat64(s.m.quotaRefusals); v != 3 {
		t.Fatalf("quota refusals = %v for 3 refused creates", v)
	}
}

// galactic_hub_identities_written_total: identities created, once each; one
// found existing is not counted.
func TestMetricIdentitiesWrittenCountsCreatesOnce(t *testing.T) {
	s := newScene(t, 2)
	s.live("team", "a")
	mustReconcile(t, s, "team", "a")
	mustReconcile(t, s, "team", "a")
	// Another writer was first: the claim is bound, the identity exists, but
	// this controller's read of it missed.
	s.live("team", "b")
	mustReconcile(t, s, "team", "b")
	blind := New(identityMiss{s.svc}, s.cache, nil, s.m, nil, Config{PlatformNamespace: platform})
	if err := blind.Reconcile(context.Background(), Key{"team", "b"}); err != nil {
		t.Fatal(err)
	}
	if v := testutil.ToFloat64(s.m.identitiesMade); v != 2 {
		t.Fatalf("identities written = %v, want 2", v)
	}
}

func mustReconcile(t *testing.T, s *scene, ns, name string) {
	t.Helper()
	if err := s.reconcile(t, ns, name); err != nil {
		t.Fatalf("reconcile %s/%s: %v", ns, name, err)
	}
}

// identityMiss reads no identity, as a controller racing another writer.
type identityMiss struct{ *addressService }

func (identityMiss) GetFabricIdentity(context.Context, string, string) (FabricIdentity, error) {
	return FabricIdentity{}, ErrNotFound
}

// galactic_hub_unclaimed_blocks: live networks holding an adopted block
// with no claim; back down when such a network goes; rebuilt by a new
// leader's sweep.
func TestMetricUnclaimedBlocksCountsAdoptedBlocks(t *testing.T) {
	s := newScene(t, 5)
	s.live("team", "a")
	mustReconcile(t, s, "team", "a")
	s.gone("team", "a")
	mustReconcile(t, s, "team", "a")
	s.live("team", "a") // returns: adopts its retained block, no claim
	mustReconcile(t, s, "team", "a")
	if v := testutil.ToFloat64(s.m.unclaimed); v != 1 {
		t.Fatalf("unclaimed = %v after an adoption, want 1", v)
	}
	m, _ := NewMetrics(prometheus.NewPedanticRegistry())
	New(s.svc, s.cache, nil, m, nil, Config{PlatformNamespace: platform}).Sweep(context.Background())
	if v := testutil.ToFloat64(m.unclaimed); v != 1 {
		t.Fatalf("unclaimed = %v after a restart's sweep, want 1", v)
	}
	s.gone("team", "a")
	mustReconcile(t, s, "team", "a")
	if v := testutil.ToFloat64(s.m.unclaimed); v != 0 {
		t.Fatalf("unclaimed = %v once the network is gone, want 0", v)
	}
}

// The behaviour decided upstream (issue 19, point 3): a returning network
// at a full quota is refused like any other, retried, and adopts its block
// once a unit frees.
func TestAReturningNetworkAtAFullQuotaWaitsForAUnitThenAdopts(t *testing.T) {
	s := newScene(t, 1)
	s.live("team", "r")
	mustReconcile(t, s, "team", "r")
	first, _ := s.identity("team", "r")
	s.gone("team", "r")
	mustReconcile(t, s, "team", "r")
	s.live("team", "a")
	mustReconcile(t, s, "team", "a") // a holds the only unit
	s.live("team", "r")
	if err := s.reconcile(t, "team", "r"); !errors.Is(err, ErrQuota) {
		t.Fatalf("returning network at a full quota: %v, want ErrQuota", err)
	}
	if err := s.reconcile(t, "team", "r"); !errors.Is(err, ErrQuota) {
		t.Fatalf("retry at a full quota: %v, want ErrQuota", err)
	}
	s.gone("team", "a")
	mustReconcile(t, s, "team", "a")
	mustReconcile(t, s, "team", "r")
	if got, ok := s.identity("team", "r"); !ok || got != first {
		t.Fatalf("returning network's identity %d (%v), want its old %d", got, ok, first)
	}
	if s.svc.nextBlock != 2 {
		t.Fatalf("%d blocks handed out, want 2: the returning network claimed a new one", s.svc.nextBlock)
	}
}

// galactic_hub_leader: 1 on the leader alone, from when it starts leading
// to when it stops; then 1 on the instance that took over. Client-go's
// elector on a real API server.
func TestMetricLeaderIsOneOnTheLeaderAlone(t *testing.T) {
	cs := electionClient(t)
	ns := platformNamespace(t, cs)
	leader := func(e *elector) float64 { return testutil.ToFloat64(e.metrics.leader) }
	one := campaign(t, cs, ns, "one")
	one.awaitLeading(t, "one")
	two := campaign(t, cs, ns, "two")
	if l1, l2 := leader(one), leader(two); l1 != 1 || l2 != 0 {
		t.Fatalf("leader gauges %v (leading) and %v (following), want 1 and 0", l1, l2)
	}
	one.stop(t)
	if l1 := leader(one); l1 != 0 {
		t.Fatalf("leader gauge %v once leadership ended, want 0", l1)
	}
	two.awaitLeading(t, "two")
	if l2 := leader(two); l2 != 1 {
		t.Fatalf("leader gauge %v on the instance that took over, want 1", l2)
	}
}
