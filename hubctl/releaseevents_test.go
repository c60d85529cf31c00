package hubctl

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// Guards the mapping of release results to events (recordRelease): a
// released claim is one Normal ClaimReleased, a DELETE the API server
// refuses and a claim the hub keeps are one Warning ClaimReleaseRefused
// however often they are retried, and a hold, a failed attempt and a
// network with no claim say nothing per claim. Each event regards the claim
// of the gone network and names the claim, the network and the block.
func TestEachReleaseResultRecordsItsEvent(t *testing.T) {
	for name, tc := range map[string]struct {
		fault    func(*scene)
		want     string // "" for no event
		persists bool   // the fault outlasts a retry (deleteClaimErr is once)
	}{
		"released": {func(*scene) {}, "Normal " + ReasonClaimReleased, false},
		"refused": {func(s *scene) { s.svc.deleteClaimErr = errorsJoin(ErrRefused, errInjected) },
			"Warning " + ReasonClaimReleaseRefused, false},
		"kept": {func(s *scene) { s.svc.policyAtBind = PolicyDelete }, "Warning " + ReasonClaimReleaseRefused, true},
		"held": {func(s *scene) {
			cfg := s.config()
			cfg.Leases, cfg.MinRetentionLease = fixedLease{l: RetentionLease{Set: true, Lease: time.Hour, From: "class fabric"}}, DefaultMinRetentionLease
			s.c = New(s.svc, s.cache, nil, s.m, nil, cfg)
		}, "", true},
		"error": {func(s *scene) { s.svc.deleteClaimErr = errInjected }, "", false},
	} {
		t.Run(name, func(t *testing.T) {
			s := newScene(t, 2)
			tc.fault(s)
			s.live("team", "a")
			mustReconcile(t, s, "team", "a")
			claim := s.svc.claims[ClaimName("team", "a")]
			s.gone("team", "a")
			_ = s.reconcile(t, "team", "a")
			if tc.persists {
				// Retried, as the workers would: a held-up release is
				// one event, not one per retry.
				_ = s.reconcile(t, "team", "a")
				_ = s.reconcile(t, "team", "a")
			}
			if tc.want == "" {
				if len(s.svc.claimEvents) != 0 {
					t.Fatalf("events %q, want none", s.svc.claimEvents)
				}
				return
			}
			if len(s.svc.claimEvents) != 1 {
				t.Fatalf("events %q, want one", s.svc.claimEvents)
			}
			e := s.svc.claimEvents[0]
			for _, w := range []string{"claim " + claim.Name + " uid=" + string(claim.UID) + " ", tc.want + " " + ActionRelease + ":",
				"team/a", claim.AllocatedCIDR} {
				if !strings.Contains(e, w) {
					t.Errorf("event %q lacks %q", e, w)
				}
			}
		})
	}
}

// A network back under its name by the time its old claim's release is
// recorded exists as an object again: the event regards it, by its UID,
// and not the claim.
func TestAReleaseEventRegardsTheNetworkWhileItExists(t *testing.T) {
	s := newScene(t, 2)
	s.live("team", "a")
	mustReconcile(t, s, "team", "a")
	claim := s.svc.claims[ClaimName("team", "a")]
	s.gone("team", "a")
	s.c.cache = fakeCache{Key{"team", "a"}: true}
	s.c.recordRelease(t.Context(), Key{"team", "a"}, claim, ReleaseKept, errors.New("kept"))
	if len(s.svc.claimEvents) != 1 || !strings.HasPrefix(s.svc.claimEvents[0], "network team/a uid=team/a Warning ") {
		t.Fatalf("events %q, want one regarding the network", s.svc.claimEvents)
	}
}
