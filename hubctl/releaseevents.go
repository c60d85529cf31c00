package hubctl

import (
	"context"
	"errors"
	"fmt"
)

// Reasons and action of the events a gone network's claim release records.
const (
	// ReasonClaimReleased (Normal): the claim was deleted; its quota unit
	// is back and its block stays retained.
	ReasonClaimReleased = "ClaimReleased"
	// ReasonClaimReleaseRefused (Warning): the claim stays, and so does its
	// quota unit, until an operator acts.
	ReasonClaimReleaseRefused = "ClaimReleaseRefused"
	// ActionRelease is the action of both, and of the hub-wide hold.
	ActionRelease = "Release"
)

// recordRelease records a gone network's claim release as an event where
// it tells an operator something; result and err are release's, and
// claim the claim it acted on (zero when there was none). Called only when
// the result is news (countRelease), so that a held-up release retried
// every backoff records one event, not one per retry.
//
// The mapping, from the results release distinguishes:
//   - released (ReleaseReleased: the DELETE was accepted, or found the
//     claim gone already): ClaimReleased. A deleted claim is not met
//     again, so it is one event per claim; a claim ipam left Releasing and
//     deleted again is a second release, as the metric counts it.
//   - refused (ReleaseRefused: the API server refused the DELETE, 403
//     other than quota, 422, 405, so the hub's credentials or the
//     address service must change): ClaimReleaseRefused.
//   - kept (ReleaseKept: the hub refuses to delete a claim whose
//     allocation is missing or not recorded Retain, since its block could
//     then be reissued; someone must fix the record or release by hand):
//     ClaimReleaseRefused. But not a claim kept because releases are held
//     (ErrReleasesHeld): the hold is the hub's, not the claim's, and is
//     recorded once as FabricIdentityReleasesHeld on the platform
//     namespace; an event per claim would repeat it for every gone network.
//   - error (ReleaseError: a failed read, a 5xx, a claim changed or
//     re-created during the release): none. It is retried with backoff,
//     and a claim re-created since belongs to whoever made it; the log and
//     galactic_hub_claim_releases_total{result="error"} say it.
//   - a network found living (networkLives) is not collected, so there is
//     no release to speak of; a living network's claim the address service
//     deleted in place of the gone one's (releaseRestored) is
//     FabricIdentityClaimRestored on that network, not a release.
//   - no claim (releaseNone): nothing.
//
// The event regards the network while it still exists as an object (a
// network back under its name, which the cache holds), with the claim as
// related; else the claim, which is all that is left of a gone network.
func (c *Controller) recordRelease(ctx context.Context, key Key, claim Claim, result string, err error) {
	if claim.Name == "" {
		return
	}
	block := claim.AllocatedCIDR
	if block == "" {
		block = "unknown"
	}
	var reason, note string
	warning := false
	switch {
	case result == ReleaseReleased:
		reason = ReasonClaimReleased
		note = fmt.Sprintf("claim %s of gone network %s released: its quota unit is back; block %s stays retained for the name", claim.Name, key, block)
	case result == ReleaseRefused, result == ReleaseKept && !errors.Is(err, ErrReleasesHeld):
		reason, warning = ReasonClaimReleaseRefused, true
		note = fmt.Sprintf("claim %s of gone network %s (block %s) not released, %s: its quota unit stays taken: %v", claim.Name, key, block, result, err)
	default:
		return
	}
	var network *Network
	if uid, ok := c.cache.UID(key.Namespace, key.Name); ok {
		network = &Network{Namespace: key.Namespace, Name: key.Name, UID: uid}
	}
	c.api.ClaimEvent(ctx, network, claim, warning, reason, ActionRelease, note)
}
