package hubctl

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// addressService models the hub for unit tests of the controller's logic:
// the platform's quota on claims (ErrQuota past the limit), the address
// service binding a claim and its allocation at once with the policy fixed
// at bind, Retain on delete (allocation kept under the claim's name,
// claimRef cleared), and the 409 AllocationRetained answer to a claim whose
// name retained an allocation. With ipam set it answers as milo-os/ipam's
// code does instead (internal/registry/ipam/ipclaim/storage.go at
// a41cd6f1): a delete ignores its preconditions and answers the claim it
// deleted, and a create re-binds a retained allocation of its name (or,
// with plainConflict, ipam at 012be054, answers a 409 with no cause). The
// integration tests run the controller against a real API server instead,
// with the CRD model and with an ipam-shaped proxy (test/framework/ipamtest).
type addressService struct {
	mu          sync.Mutex
	quota       int
	networks    map[Key]Network
	identities  map[Key]FabricIdentity
	claims      map[string]Claim
	allocations map[string]Allocation
	nextBlock   int
	freeBlocks  []string // blocks freed by deleting a non-Retain allocation, reissued first
	uids        int
	rv          int // the last resourceVersion given
	events      []string
	claimEvents []string // ClaimEvent's, apart: the release tests count events

	// Faults and hooks, set by tests.
	getNetworkErr  error                   // fails every read of networks: GetNetwork and ListNetworkKeys
	deleteClaimErr error                   // returned once
	beforeDelete   func(s *addressService) // runs inside DeleteClaim, before the precondition check
	policyAtBind   string                  // overrides the policy recorded on new allocations
	deletedClaims  []string
	// ipam: answer as ipam does (above); plainConflict: a retained
	// allocation of the name is a 409 with no cause (012be054).
	ipam, plainConflict bool
}

func newAddressService(quota int) *addressService {
	return &addressService{quota: quota, networks: map[Key]Network{}, identities: map[Key]FabricIdentity{},
		claims: map[string]Claim{}, allocations: map[string]Allocation{}}
}

// cache is a network cache the test controls, separately from the truth.
type fakeCache map[Key]bool

func (c fakeCache) Exists(ns, name string) bool { return c[Key{ns, name}] }

func (c fakeCache) Keys() []Key {
	var out []Key
	for k, live := range c {
		if live {
			out = append(out, k)
		}
	}
	return out
}

func (c fakeCache) Len() int { return len(c.Keys()) }

// UID is the namespace/name key itself: distinct per network, and enough
// to check that events carry it.
func (c fakeCache) UID(ns, name string) (types.UID, bool) {
	return types.UID(ns + "/" + name), c[Key{ns, name}]
}

func (s *addressService) addNetwork(ns, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.uids++
	s.networks[Key{ns, name}] = Network{Namespace: ns, Name: name, UID: types.UID(fmt.Sprint(s.uids))}
}

func (s *addressService) deleteNetwork(ns, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.networks, Key{ns, name})
}

func (s *addressService) GetNetwork(_ context.Context, ns, name string) (Network, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.getNetworkErr != nil {
		return Network{}, s.getNetworkErr
	}
	n, ok := s.networks[Key{ns, name}]
	if !ok {
		return Network{}, ErrNotFound
	}
	return n, nil
}

func (s *addressService) ListNetworkKeys(context.Context) ([]Key, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.getNetworkErr != nil {
		return nil, s.getNetworkErr
	}
	out := make([]Key, 0, len(s.networks))
	for k := range s.networks {
		out = append(out, k)
	}
	return out, nil
}

// nextRV returns a new resourceVersion; s.mu is held.
func (s *addressService) nextRV() string {
	s.rv++
	return fmt.Sprint(s.rv)
}

// changeClaim applies change to claim name and gives it a new
// resourceVersion, as any write to it does.
func (s *addressService) changeClaim(name string, change func(*Claim)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.claims[name]
	change(&c)
	c.ResourceVersion = s.nextRV()
	s.claims[name] = c
}

func (s *addressService) GetFabricIdentity(_ context.Context, ns, name string) (FabricIdentity, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.identities[Key{ns, name}]
	if !ok {
		return FabricIdentity{}, ErrNotFound
	}
	return id, nil
}

func (s *addressService) CreateFabricIdentity(_ context.Context, id FabricIdentity) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.identities[Key{id.Namespace, id.Name}]; ok {
		return ErrExists
	}
	s.identities[Key{id.Namespace, id.Name}] = id
	return nil
}

func (s *addressService) DeleteFabricIdentity(_ context.Context, ns, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.identities[Key{ns, name}]; !ok {
		return ErrNotFound
	}
	delete(s.identities, Key{ns, name})
	return nil
}

func (s *addressService) CreateClaim(_ context.Context, c Claim) (Claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.claims[c.Name]; ok {
		return Claim{}, fmt.Errorf("claim %s exists: %w", c.Name, ErrRefused)
	}
	if len(s.claims) >= s.quota {
		return Claim{}, fmt.Errorf("exceeded quota: count/ipclaims.ipam.miloapis.com=%d: %w", s.quota, ErrQuota)
	}
	allocName := AllocationName(c.Namespace, c.Name)
	if a, ok := s.allocations[allocName]; ok && a.ClaimRef != "" && (s.ipam || s.plainConflict) {
		// ipam: "an allocation under this identity is already bound".
		return Claim{}, fmt.Errorf("allocation %s is bound to %s: %w", allocName, a.ClaimRef, ErrConflict)
	}
	if a, ok := s.allocations[allocName]; ok && a.ClaimRef == "" {
		switch {
		case s.plainConflict:
			return Claim{}, fmt.Errorf("an allocation under this identity already exists: IPAllocation %q: %w", allocName, ErrConflict)
		case !s.ipam:
			return Claim{}, &AllocationRetainedError{Allocation: allocName}
		}
		// a41cd6f1 re-binds it: the claim is bound to the same block.
		s.uids++
		c.UID = types.UID(fmt.Sprint(s.uids))
		c.ResourceVersion = s.nextRV()
		c.Phase, c.AllocatedCIDR, c.BoundAllocation = "Bound", a.AllocatedCIDR, allocName
		s.claims[c.Name] = c
		a.ClaimRef, a.ResourceVersion = c.Name, s.nextRV()
		s.allocations[allocName] = a
		return c, nil
	}
	s.uids++
	policy := c.ReclaimPolicy
	if policy == "" {
		policy = PolicyDelete
	}
	if s.policyAtBind != "" {
		policy = s.policyAtBind
	}
	c.UID = types.UID(fmt.Sprint(s.uids))
	c.ResourceVersion = s.nextRV()
	block := ""
	if n := len(s.freeBlocks); n > 0 {
		block, s.freeBlocks = s.freeBlocks[n-1], s.freeBlocks[:n-1]
	} else {
		s.nextBlock++
		block = fmt.Sprintf("fd00:0:%x:%x::/64", s.nextBlock>>16, s.nextBlock&0xffff)
	}
	c.Phase, c.AllocatedCIDR, c.BoundAllocation = "Bound", block, allocName
	s.claims[c.Name] = c
	s.allocations[allocName] = Allocation{Namespace: c.Namespace, Name: allocName, ResourceVersion: s.nextRV(), ClaimRef: c.Name, ReclaimPolicy: policy, AllocatedCIDR: c.AllocatedCIDR}
	return c, nil
}

func (s *addressService) GetClaim(_ context.Context, _, name string) (Claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.claims[name]
	if !ok {
		return Claim{}, ErrNotFound
	}
	return c, nil
}

func (s *addressService) ListClaims(context.Context, string) ([]Claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Claim
	for _, c := range s.claims {
		out = append(out, c)
	}
	return out, nil
}

func (s *addressService) DeleteClaim(_ context.Context, _, name string, uid types.UID, resourceVersion string) (types.UID, error) {
	if s.beforeDelete != nil {
		hook := s.beforeDelete
		s.beforeDelete = nil
		hook(s)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.deleteClaimErr; err != nil {
		s.deleteClaimErr = nil
		return "", err
	}
	c, ok := s.claims[name]
	if !ok {
		return "", ErrNotFound
	}
	// ipam never reads a delete's preconditions: whichever claim holds
	// the name goes.
	if !s.ipam && uid != "" && c.UID != uid { // an empty uid is a delete without precondition
		return "", fmt.Errorf("uid %s, want %s: %w", c.UID, uid, ErrPrecondition)
	}
	if !s.ipam && resourceVersion != "" && c.ResourceVersion != resourceVersion {
		return "", fmt.Errorf("resourceVersion %s, want %s: %w", c.ResourceVersion, resourceVersion, ErrChanged)
	}
	delete(s.claims, name)
	s.deletedClaims = append(s.deletedClaims, name)
	a := s.allocations[c.BoundAllocation]
	if a.ReclaimPolicy == PolicyRetain {
		a.ClaimRef = ""
		a.ResourceVersion = s.nextRV()
		s.allocations[c.BoundAllocation] = a
	} else {
		delete(s.allocations, c.BoundAllocation) // the block is free for reissue
		s.freeBlocks = append(s.freeBlocks, a.AllocatedCIDR)
	}
	return c.UID, nil
}

func (s *addressService) GetAllocation(_ context.Context, _, name string) (Allocation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.allocations[name]
	if !ok {
		return Allocation{}, ErrNotFound
	}
	return a, nil
}

func (s *addressService) ListAllocations(context.Context, string) ([]Allocation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Allocation
	for _, a := range s.allocations {
		out = append(out, a)
	}
	return out, nil
}

func (s *addressService) Event(_ context.Context, n Network, _ bool, reason, msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, n.Namespace+"/"+n.Name+" uid="+string(n.UID)+" "+reason+": "+msg)
}

func (s *addressService) ClaimEvent(_ context.Context, n *Network, c Claim, warning bool, reason, action, msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	on := "claim " + c.Name + " uid=" + string(c.UID)
	if n != nil {
		on = "network " + n.Namespace + "/" + n.Name + " uid=" + string(n.UID)
	}
	typ := "Normal"
	if warning {
		typ = "Warning"
	}
	s.claimEvents = append(s.claimEvents, on+" "+typ+" "+reason+" "+action+": "+msg)
}

func (s *addressService) HubEvent(_ context.Context, _ bool, reason, msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, "hub "+reason+": "+msg)
}

var errInjected = errors.New("injected fault")

// svcCaches are the controller's caches over the model: informers that
// are always current. Tests that need a stale cache wrap them.
type svcCaches struct{ s *addressService }

type svcClaims svcCaches

func (c svcClaims) Get(name string) (Claim, bool) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	cl, ok := c.s.claims[name]
	return cl, ok
}

func (c svcClaims) List() []Claim {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	out := make([]Claim, 0, len(c.s.claims))
	for _, cl := range c.s.claims {
		out = append(out, cl)
	}
	return out
}

type svcAllocations svcCaches

func (c svcAllocations) Get(name string) (Allocation, bool) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	a, ok := c.s.allocations[name]
	return a, ok
}

func (c svcAllocations) List() []Allocation {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	out := make([]Allocation, 0, len(c.s.allocations))
	for _, a := range c.s.allocations {
		out = append(out, a)
	}
	return out
}

type svcIdentities svcCaches

func (c svcIdentities) Get(ns, name string) (FabricIdentity, bool) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	id, ok := c.s.identities[Key{ns, name}]
	return id, ok
}

// cached sets cfg's caches to the model's.
func (s *addressService) cached(cfg Config) Config {
	cfg.Claims, cfg.Allocations, cfg.Identities = svcClaims{s}, svcAllocations{s}, svcIdentities{s}
	return cfg
}

// counting counts the requests the controller makes of the API, by method.
type counting struct {
	API
	mu    sync.Mutex
	calls map[string]int
}

func (c *counting) count(method string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.calls == nil {
		c.calls = map[string]int{}
	}
	c.calls[method]++
}

func (c *counting) GetNetwork(ctx context.Context, ns, name string) (Network, error) {
	c.count("GetNetwork")
	return c.API.GetNetwork(ctx, ns, name)
}

func (c *counting) ListNetworkKeys(ctx context.Context) ([]Key, error) {
	c.count("ListNetworkKeys")
	return c.API.ListNetworkKeys(ctx)
}

func (c *counting) GetFabricIdentity(ctx context.Context, ns, name string) (FabricIdentity, error) {
	c.count("GetFabricIdentity")
	return c.API.GetFabricIdentity(ctx, ns, name)
}

func (c *counting) CreateFabricIdentity(ctx context.Context, id FabricIdentity) error {
	c.count("CreateFabricIdentity")
	return c.API.CreateFabricIdentity(ctx, id)
}

func (c *counting) DeleteFabricIdentity(ctx context.Context, ns, name string) error {
	c.count("DeleteFabricIdentity")
	return c.API.DeleteFabricIdentity(ctx, ns, name)
}

func (c *counting) CreateClaim(ctx context.Context, cl Claim) (Claim, error) {
	c.count("CreateClaim")
	return c.API.CreateClaim(ctx, cl)
}

func (c *counting) GetClaim(ctx context.Context, ns, name string) (Claim, error) {
	c.count("GetClaim")
	return c.API.GetClaim(ctx, ns, name)
}

func (c *counting) ListClaims(ctx context.Context, ns string) ([]Claim, error) {
	c.count("ListClaims")
	return c.API.ListClaims(ctx, ns)
}

func (c *counting) DeleteClaim(ctx context.Context, ns, name string, uid types.UID, rv string) (types.UID, error) {
	c.count("DeleteClaim")
	return c.API.DeleteClaim(ctx, ns, name, uid, rv)
}

func (c *counting) GetAllocation(ctx context.Context, ns, name string) (Allocation, error) {
	c.count("GetAllocation")
	return c.API.GetAllocation(ctx, ns, name)
}

func (c *counting) ListAllocations(ctx context.Context, ns string) ([]Allocation, error) {
	c.count("ListAllocations")
	return c.API.ListAllocations(ctx, ns)
}
