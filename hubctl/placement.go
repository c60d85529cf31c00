package hubctl

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Placement carries a network's fabric identity to the locations the
// network runs in, and takes it back. The controller places a live network
// once it has its identity, and unplaces a gone one between the identity's
// delete and the claim's release (the seed's collect()).
type Placement interface {
	// Place brings the placement of live network key to the locations of
	// its contexts. It withdraws a location only on a successful read of
	// the contexts past any cache, and changes nothing for a network being
	// deleted.
	Place(ctx context.Context, key Key) error
	// Unplace removes the placement of network key, confirmed gone.
	Unplace(ctx context.Context, key Key) error
	// Placed lists the networks that placements select, as the startup
	// sweep needs them: those whose network is gone are collected.
	Placed() []Key
	// RemoveLegacy removes, once, the placements of an older form that
	// the current one replaces, and reports how many it removed and how
	// many it could not.
	RemoveLegacy(ctx context.Context) (removed, failed int)
}

// NoPlacement places nothing and unplaces nothing: for a hub without a
// placement system (--placement=none).
type NoPlacement struct{}

// Place implements Placement.
func (NoPlacement) Place(context.Context, Key) error { return nil }

// Unplace implements Placement.
func (NoPlacement) Unplace(context.Context, Key) error { return nil }

// Placed implements Placement.
func (NoPlacement) Placed() []Key { return nil }

// RemoveLegacy implements Placement.
func (NoPlacement) RemoveLegacy(context.Context) (int, int) { return 0, 0 }

// The shape of a placement, as the fabric identity controller of
// datum-cloud/cloud writes it (docs/hub.md, "Placement").
const (
	// PolicyPrefix starts the name of the one ClusterPropagationPolicy
	// per fabric identity: cloud-fabric-identity-<namespace>-<network>.
	PolicyPrefix = "cloud-fabric-identity-"
	// LabelPolicy marks every policy the fabric identity controller
	// writes. A policy without it is never touched.
	LabelPolicy = "cloud.datumapis.com/fabric-identity-policy"
	// LabelLocationPrefix, followed by a location's name, labels an
	// identity "true" for each location it is needed at: the readable
	// record of its placement.
	LabelLocationPrefix = "cloud.datumapis.com/location-"
	// LocationTopologyKey is the label of a Karmada member cluster that
	// names its location.
	LocationTopologyKey = "topology.datum.net/location"
	// PlacementFieldManager owns what the hub applies to policies: the
	// fabric identity controller's own manager, so that a hub that takes
	// its place owns the policies it wrote, with no conflict.
	PlacementFieldManager = "cloud-fabric-identity"
)

// PolicyName is the ClusterPropagationPolicy that places the fabric
// identity of network namespace/name: cloud-fabric-identity-<namespace>-<name>,
// or, when that exceeds 253 characters, cloud-fabric-identity- and the
// sha256 of "namespace/name" in hex, as ClaimName hashes claim names. The
// dash makes two networks' names meet (a-b/c and a/b-c): a policy is
// therefore only ever taken as a network's when it selects that network's
// identity by namespace and name, and a name held by another identity's
// policy is refused, never overwritten.
func PolicyName(namespace, name string) string {
	n := PolicyPrefix + namespace + "-" + name
	if len(n) <= maxNameLen {
		return n
	}
	sum := sha256.Sum256([]byte(namespace + "/" + name))
	return PolicyPrefix + hex.EncodeToString(sum[:])
}

// LocationLabel is the identity's label that records location.
func LocationLabel(location string) string { return LabelLocationPrefix + location }

// PlacementPolicy is a ClusterPropagationPolicy as placement reads it.
type PlacementPolicy struct {
	Name            string
	UID             types.UID
	ResourceVersion string
	// Labelled: it carries LabelPolicy "true".
	Labelled bool
	// Deleting: it has a deletionTimestamp (Karmada's finalizers hold it).
	Deleting bool
	// Identity is the one NetworkFabricIdentity it selects by namespace
	// and name; Selects is false when its selectors are anything else.
	Identity Key
	Selects  bool
	// Named is false when a selector names no object: the older
	// per-location form, which selected identities by label.
	Named bool
	// Locations are the values of its LocationTopologyKey In expression.
	Locations []string
	// Overwrite: its conflictResolution is Overwrite.
	Overwrite bool
}

// selects reports whether p is the placement of network key's identity.
func (p PlacementPolicy) selects(key Key) bool { return p.Selects && p.Identity == key }

// legacy reports whether p is of the older per-location form: labelled,
// with a selector that names no object.
func (p PlacementPolicy) legacy() bool { return p.Labelled && !p.Named }

// PlacementAPI is what placement reads and writes past the caches.
type PlacementAPI interface {
	// NetworkLocations reads the locations of network namespace/name's
	// contexts past any cache, in one consistent read: a context being
	// deleted counts.
	NetworkLocations(ctx context.Context, namespace, name string) ([]string, error)
	// GetNetwork reads the network past any cache.
	GetNetwork(ctx context.Context, namespace, name string) (Network, error)
	// CreatePolicy creates the policy placing network key's identity at
	// locations; ErrExists when its name is taken, and nothing written.
	CreatePolicy(ctx context.Context, key Key, locations []string) error
	// ApplyPolicy writes by server-side apply, taking ownership of every
	// field it sets, the policy placing network key's identity at
	// locations, only over the policy at resourceVersion (else a
	// conflict): the one read as this identity's.
	ApplyPolicy(ctx context.Context, key Key, locations []string, resourceVersion string) error
	// DeletePolicy deletes the policy name only if its UID is uid (else
	// ErrPrecondition).
	DeletePolicy(ctx context.Context, name string, uid types.UID) error
	// SetIdentityLocations makes the location labels of network key's
	// identity add and drop.
	SetIdentityLocations(ctx context.Context, key Key, add, drop []string) error
	Event(ctx context.Context, n Network, warning bool, reason, message string)
}

// PlacementCache answers from informers' caches.
type PlacementCache interface {
	// Locations are the locations of network namespace/name's contexts.
	Locations(namespace, name string) []string
	// Policy is the labelled policy called name.
	Policy(name string) (PlacementPolicy, bool)
	// Policies lists the labelled policies.
	Policies() []PlacementPolicy
	// IdentityLocations are the locations the identity's labels record.
	IdentityLocations(namespace, name string) []string
	// Deleting reports whether network namespace/name has a
	// deletionTimestamp.
	Deleting(namespace, name string) bool
	// UID is the cached network's UID, for events.
	UID(namespace, name string) (types.UID, bool)
}

// ErrWithdrawalHeld: a location would be withdrawn, but the contexts
// could not be read to confirm it: nothing was withdrawn.
var ErrWithdrawalHeld = errors.New("withdrawal held: the network's contexts could not be read")

// Placement refusal causes, the values of the cause label.
const (
	// CausePolicyTaken: the policy's name is held by a policy that is not
	// this identity's (another network whose name meets this one's, or
	// a policy without the label).
	CausePolicyTaken = "policy_taken"
	// CauseLocationName: a location's name is no label value, so no
	// member cluster can be matched on it.
	CauseLocationName = "location_name"
	// CauseLabelKey: a location's name makes no label key on the identity
	// (over 54 characters): placed, but not recorded on the identity.
	CauseLabelKey = "label_key"
	// CausePlacementRefused: the API server refused the write (403, 422).
	CausePlacementRefused = "refused"
)

// contextsReadTimeout bounds the read of the contexts that a withdrawal
// waits on: a slow read withdraws nothing, it is not waited on for ever.
const contextsReadTimeout = 10 * time.Second

// Placer is the Placement of the hub: one Karmada ClusterPropagationPolicy
// per fabric identity, selecting it by name, at the locations of its
// network's contexts (docs/hub.md, "Placement").
type Placer struct {
	api     PlacementAPI
	cache   PlacementCache
	metrics *Metrics
	log     *slog.Logger

	mu sync.Mutex
	// applied is what this instance last wrote for each network: a cache
	// that has not caught up with a write must not make its locations
	// look unplaced, or their withdrawal would skip the read past the cache.
	applied map[Key][]string
	// refused holds each network's current refusal causes, so that each is
	// named once (event, metric, log) and not on every retry.
	refused map[Key]map[string]bool
	// held holds the networks whose withdrawal is held now.
	held map[Key]bool
}

// NewPlacer returns the Placement over api and cache; writes hold fence
// (nil: Unfenced). metrics and log may be nil.
func NewPlacer(api PlacementAPI, cache PlacementCache, fence Fence, metrics *Metrics, log *slog.Logger) *Placer {
	if fence == nil {
		fence = Unfenced{}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Placer{api: fencedPlacement{PlacementAPI: api, fence: fence}, cache: cache, metrics: metrics, log: log,
		applied: map[Key][]string{}, refused: map[Key]map[string]bool{}, held: map[Key]bool{}}
}

// Place implements Placement.
func (p *Placer) Place(ctx context.Context, key Key) error {
	if p.cache.Deleting(key.Namespace, key.Name) {
		// Teardown needs the identity where it is: a network being deleted
		// keeps its placement until it is gone.
		return nil
	}
	name := PolicyName(key.Namespace, key.Name)
	policy, found := p.cache.Policy(name)
	switch {
	case found && policy.Deleting:
		// Karmada's finalizers hold it; its delete wakes the network
		// (PolicyChanged), which is placed afresh then.
		p.log.Debug("placement policy being deleted; placing once it is gone", "network", key.String(), "policy", name)
		return nil
	case found && !policy.selects(key):
		err := fmt.Errorf("policy %s is not the placement of %s: it selects %s; not overwritten", name, key, selected(policy))
		p.refuse(ctx, key, CausePolicyTaken, err)
		return &ConfigError{Cause: CausePolicyTaken, Err: err}
	case found:
		p.clearRefused(key, CausePolicyTaken)
	}
	placed := p.placed(key, policy, found)
	want := normalize(p.cache.Locations(key.Namespace, key.Name))
	var heldErr error
	confirmed := false
	// A policy found is deleted only on a read too, whatever its
	// locations parse as.
	if len(missing(placed, want)) > 0 || (found && len(want) == 0) {
		// A location would be withdrawn: only a successful read of the
		// contexts, past the cache, may say so. A failed or slow one
		// withdraws nothing, and what the cache adds is still placed.
		rctx, cancel := context.WithTimeout(ctx, contextsReadTimeout)
		fresh, err := p.api.NetworkLocations(rctx, key.Namespace, key.Name)
		if err == nil {
			// Then the network, past the cache too: a network's finalizer
			// deletes its contexts only after its deletionTimestamp is set,
			// so a read made after the contexts' sees it, however the
			// network cache lags the context cache. Being deleted or gone,
			// it keeps its placement (rule 7); gone, its collect unplaces
			// it.
			var n Network
			n, err = p.api.GetNetwork(rctx, key.Namespace, key.Name)
			switch {
			case errors.Is(err, ErrNotFound), err == nil && n.Deleting:
				cancel()
				p.setHeld(ctx, key, nil)
				return nil
			case err != nil:
				err = fmt.Errorf("read network: %w", err)
			}
		}
		cancel()
		if err != nil {
			heldErr = fmt.Errorf("place %s: withdrawing %v: %w: %w", key, missing(placed, want), ErrWithdrawalHeld, err)
			want = normalize(append(want, placed...))
			p.setHeld(ctx, key, heldErr)
		} else {
			want, confirmed = normalize(fresh), true
		}
	}
	if heldErr == nil {
		p.setHeld(ctx, key, nil)
	}
	want = p.placeable(ctx, key, want)
	var err error
	switch {
	case len(want) == 0 && found && !confirmed:
		// Nothing placeable is left only because the read failed and what
		// is placed cannot be placed again: the policy stays.
	case len(want) == 0:
		err = p.unplaceLive(ctx, key, name, policy, found, placed)
	default:
		err = p.apply(ctx, key, name, policy, found, want, placed)
	}
	if heldErr != nil && err != nil {
		// Retried with backoff for the read, not slowly for the refusal:
		// the refusal is named already, and stays in the message.
		return fmt.Errorf("%w; and: %s", heldErr, err.Error())
	}
	if heldErr != nil {
		return heldErr
	}
	return err
}

// placed is where network key's identity is placed, as far as anything
// here knows: its policy, its identity's labels, and this instance's last
// write.
func (p *Placer) placed(key Key, policy PlacementPolicy, found bool) []string {
	var at []string
	if found {
		at = append(at, policy.Locations...)
	}
	at = append(at, p.cache.IdentityLocations(key.Namespace, key.Name)...)
	p.mu.Lock()
	at = append(at, p.applied[key]...)
	p.mu.Unlock()
	return normalize(at)
}

// placeable keeps of want the locations a member cluster's label can
// carry: a name that is no label value cannot be placed, and is named
// once.
func (p *Placer) placeable(ctx context.Context, key Key, want []string) []string {
	var bad []string
	out := want[:0:0]
	for _, l := range want {
		if len(validation.IsValidLabelValue(l)) > 0 || l == "" {
			bad = append(bad, l)
			continue
		}
		out = append(out, l)
	}
	if len(bad) > 0 {
		p.refuse(ctx, key, CauseLocationName, fmt.Errorf("locations %q of %s are not label values: no member cluster can be matched on them; not placed there", bad, key))
	} else {
		p.clearRefused(key, CauseLocationName)
	}
	return out
}

// apply writes the policy and the identity's labels when they differ from
// want.
func (p *Placer) apply(ctx context.Context, key Key, name string, policy PlacementPolicy, found bool, want, placed []string) error {
	if !found || !policy.Overwrite || !slices.Equal(normalize(policy.Locations), want) {
		// Applied only over the policy the cache shows this identity's, at
		// the version read: one it does not show may be a policy without
		// the label that holds the name, and a create, unlike an apply,
		// cannot touch it; one changed since (deleted, and the name taken
		// by another network's) is a conflict, decided again once the
		// cache has it.
		var err error
		if found {
			err = p.api.ApplyPolicy(ctx, key, want, policy.ResourceVersion)
		} else {
			err = p.api.CreatePolicy(ctx, key, want)
		}
		if err != nil {
			if errors.Is(err, ErrExists) && !p.wrote(key) {
				err = fmt.Errorf("policy %s of %s: its name is held by a policy without the label %s: %w", name, key, LabelPolicy, err)
				p.refuse(ctx, key, CausePolicyTaken, err)
				return &ConfigError{Cause: CausePolicyTaken, Err: err}
			}
			if errors.Is(err, ErrRefused) {
				p.refuse(ctx, key, CausePlacementRefused, err)
				return &ConfigError{Cause: CausePlacementRefused, Err: fmt.Errorf("place %s at %v: %w", key, want, err)}
			}
			return fmt.Errorf("place %s at %v: %w", key, want, err)
		}
		p.clearRefused(key, CausePlacementRefused)
		p.clearRefused(key, CausePolicyTaken)
		var before []string
		if found {
			before = normalize(policy.Locations)
		}
		gone := missing(before, want)
		p.setApplied(key, want)
		if p.metrics != nil {
			p.metrics.placementsWritten.Inc()
			if len(gone) > 0 {
				p.metrics.withdrawals.WithLabelValues(WithdrawalMoved).Inc()
			}
		}
		p.log.Info("fabric identity placed", "network", key.String(), "policy", name, "locations", want, "withdrawn", gone)
		msg := fmt.Sprintf("placed at %s by policy %s", strings.Join(want, ", "), name)
		if len(gone) > 0 {
			msg += "; withdrawn from " + strings.Join(gone, ", ")
		}
		p.api.Event(ctx, p.networkRef(key), false, "FabricIdentityPlaced", msg)
	}
	return p.label(ctx, key, want, placed)
}

// label makes the identity's location labels record exactly want. The
// labels of the locations placed until now and not wanted are dropped even
// when the identity cache does not show them yet: a label written a moment
// ago must not outlive its withdrawal.
func (p *Placer) label(ctx context.Context, key Key, want, placed []string) error {
	var record []string
	for _, l := range want {
		if len(validation.IsQualifiedName(LocationLabel(l))) > 0 {
			continue
		}
		record = append(record, l)
	}
	if len(record) < len(want) {
		p.refuse(ctx, key, CauseLabelKey, fmt.Errorf("locations %v of %s make no label key under %s: placed, but not recorded on the identity",
			missing(want, record), key, LabelLocationPrefix))
	} else {
		p.clearRefused(key, CauseLabelKey)
	}
	have := normalize(p.cache.IdentityLocations(key.Namespace, key.Name))
	add, drop := missing(record, have), normalize(append(missing(have, record), missing(placed, want)...))
	if len(add) == 0 && len(drop) == 0 {
		return nil
	}
	if err := p.api.SetIdentityLocations(ctx, key, add, drop); err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("record locations of %s on its identity: %w", key, err)
	}
	return nil
}

// unplaceLive removes the placement of a live network that no location
// needs any more; its identity stays, so that the next context finds the
// value the fabric already knows it by.
func (p *Placer) unplaceLive(ctx context.Context, key Key, name string, policy PlacementPolicy, found bool, placed []string) error {
	// Nothing is wanted, so nothing is refused.
	p.clearRefused(key, CausePolicyTaken)
	p.clearRefused(key, CausePlacementRefused)
	if found {
		deleted, err := p.delete(ctx, key, policy)
		if err != nil {
			return err
		}
		if deleted && p.metrics != nil {
			p.metrics.withdrawals.WithLabelValues(WithdrawalNoLocation).Inc()
		}
		p.log.Info("fabric identity unplaced: no context needs it; the identity stays", "network", key.String(), "policy", name,
			"withdrawn", policy.Locations)
		p.api.Event(ctx, p.networkRef(key), false, "FabricIdentityUnplaced",
			fmt.Sprintf("no context places the network any more: policy %s deleted, withdrawn from %s; the fabric identity stays", name, strings.Join(policy.Locations, ", ")))
	}
	p.setApplied(key, nil)
	return p.label(ctx, key, nil, placed)
}

// Unplace implements Placement: the policy is deleted when it is this
// identity's, preconditioned on the UID the cache read. One the cache has
// not seen yet reaches the controller through PolicyChanged, which
// collects its gone network again.
func (p *Placer) Unplace(ctx context.Context, key Key) error {
	defer p.forget(key)
	name := PolicyName(key.Namespace, key.Name)
	policy, found := p.cache.Policy(name)
	switch {
	case !found || policy.Deleting:
		return nil
	case !policy.selects(key):
		p.log.Info("policy of a collected network's name is another's; left alone", "network", key.String(), "policy", name,
			"selects", selected(policy))
		return nil
	}
	deleted, err := p.delete(ctx, key, policy)
	if err != nil || !deleted {
		return err
	}
	if p.metrics != nil {
		p.metrics.withdrawals.WithLabelValues(WithdrawalCollected).Inc()
	}
	p.log.Info("fabric identity unplaced: network gone", "network", key.String(), "policy", name, "withdrawn", policy.Locations)
	return nil
}

// delete deletes policy, which places key's identity, if it is still the
// object the cache read, and reports whether this delete removed it (not:
// it was gone already).
func (p *Placer) delete(ctx context.Context, key Key, policy PlacementPolicy) (bool, error) {
	err := p.api.DeletePolicy(ctx, policy.Name, policy.UID)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ErrNotFound):
		return false, nil
	case errors.Is(err, ErrPrecondition):
		// Re-created since the cache read it: the new one is decided on
		// when the cache holds it, which wakes the network.
		return false, fmt.Errorf("unplace %s: policy %s was re-created since it was read: %w", key, policy.Name, err)
	}
	return false, fmt.Errorf("unplace %s: delete policy %s: %w", key, policy.Name, err)
}

// PolicyGone is told that network key's policy left the policy cache
// (deleted, being deleted, or its label removed): what this instance wrote
// is no longer there, so a create that finds the name taken is not its own
// write met again.
func (p *Placer) PolicyGone(key Key) { p.setApplied(key, nil) }

// Placed implements Placement.
func (p *Placer) Placed() []Key {
	var out []Key
	for _, pol := range p.cache.Policies() {
		if pol.Labelled && pol.Selects && !pol.Deleting && pol.Name == PolicyName(pol.Identity.Namespace, pol.Identity.Name) {
			out = append(out, pol.Identity)
		}
	}
	return out
}

// RemoveLegacy implements Placement: the labelled policies of the older
// per-location form, which selected identities by their location labels,
// are deleted, each once and best effort. Karmada binds a resource to one
// policy only, so while they stand they hold the identities they select
// from the per-identity policies.
func (p *Placer) RemoveLegacy(ctx context.Context) (removed, failed int) {
	for _, pol := range p.cache.Policies() {
		if !pol.legacy() || pol.Deleting {
			continue
		}
		if err := p.api.DeletePolicy(ctx, pol.Name, pol.UID); err != nil && !errors.Is(err, ErrNotFound) {
			p.log.Warn("older per-location policy not removed; left for the next start", "policy", pol.Name, "error", err)
			failed++
			continue
		}
		p.log.Info("older per-location policy removed: one policy per identity replaces it", "policy", pol.Name, "locations", pol.Locations)
		removed++
	}
	return removed, failed
}

// forget drops what this instance remembers of network key: it is gone.
func (p *Placer) forget(key Key) {
	p.mu.Lock()
	delete(p.applied, key)
	delete(p.refused, key)
	delete(p.held, key)
	refused, held := len(p.refused), len(p.held)
	if p.metrics != nil {
		p.metrics.placementsRefused.Set(float64(refused))
		p.metrics.withdrawalsHeld.Set(float64(held))
	}
	p.mu.Unlock()
}

// wrote reports whether this instance has written network key's policy
// and not removed it since: a create that finds it existing then meets the
// instance's own write, which the cache has not caught up with.
func (p *Placer) wrote(key Key) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.applied[key]) > 0
}

func (p *Placer) setApplied(key Key, at []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(at) == 0 {
		delete(p.applied, key)
		return
	}
	p.applied[key] = at
}

// setHeld records whether network key's withdrawal is held (err not nil),
// naming each change once.
func (p *Placer) setHeld(ctx context.Context, key Key, err error) {
	p.mu.Lock()
	was := p.held[key]
	if err != nil {
		p.held[key] = true
	} else {
		delete(p.held, key)
	}
	if p.metrics != nil {
		p.metrics.withdrawalsHeld.Set(float64(len(p.held)))
	}
	p.mu.Unlock()
	switch {
	case err != nil && !was:
		p.log.Warn("withdrawal held: nothing withdrawn until the contexts can be read", "network", key.String(), "error", err)
		p.api.Event(ctx, p.networkRef(key), true, "FabricIdentityWithdrawalHeld",
			"a location would be withdrawn, but the network's contexts could not be read to confirm it: nothing withdrawn, retrying: "+err.Error())
	case err == nil && was:
		p.log.Info("withdrawal no longer held: the contexts were read", "network", key.String())
	}
}

// refuse names a placement refusal of network key once per cause.
func (p *Placer) refuse(ctx context.Context, key Key, cause string, err error) {
	p.mu.Lock()
	causes := p.refused[key]
	if causes == nil {
		causes = map[string]bool{}
		p.refused[key] = causes
	}
	seen := causes[cause]
	causes[cause] = true
	if p.metrics != nil {
		p.metrics.placementsRefused.Set(float64(len(p.refused)))
	}
	p.mu.Unlock()
	if seen {
		return
	}
	if p.metrics != nil {
		p.metrics.placementRefusals.WithLabelValues(cause).Inc()
	}
	p.log.Warn("placement refused", "network", key.String(), "cause", cause, "error", err)
	p.api.Event(ctx, p.networkRef(key), true, "FabricIdentityPlacementRefused", fmt.Sprintf("%s: %v", cause, err))
}

func (p *Placer) clearRefused(key Key, cause string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.refused[key]; !ok {
		return
	}
	delete(p.refused[key], cause)
	if len(p.refused[key]) == 0 {
		delete(p.refused, key)
	}
	// Under the lock, so that the last count written is the last made.
	if p.metrics != nil {
		p.metrics.placementsRefused.Set(float64(len(p.refused)))
	}
}

func (p *Placer) networkRef(key Key) Network {
	uid, _ := p.cache.UID(key.Namespace, key.Name)
	return Network{Namespace: key.Namespace, Name: key.Name, UID: uid}
}

// Withdrawal reasons, the values of the reason label.
const (
	WithdrawalMoved      = "moved"       // some locations left the policy, others stay
	WithdrawalNoLocation = "no_location" // the last context went: the policy deleted, the identity kept
	WithdrawalCollected  = "collected"   // the network is gone: the policy deleted with its identity
)

// normalize sorts and de-duplicates locations.
func normalize(locations []string) []string {
	out := slices.Clone(locations)
	slices.Sort(out)
	return slices.Compact(out)
}

// missing is what of from is not in to; both normalized.
func missing(from, to []string) []string {
	var out []string
	for _, l := range from {
		if _, ok := slices.BinarySearch(to, l); !ok {
			out = append(out, l)
		}
	}
	return out
}

// selected says what a policy selects, for a message.
func selected(p PlacementPolicy) string {
	switch {
	case p.Selects:
		return "identity " + p.Identity.String()
	case !p.Named:
		return "identities by label (the older per-location form)"
	}
	return "something other than one identity"
}
