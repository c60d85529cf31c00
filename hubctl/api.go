// Package hubctl is the compact fabric-identity controller of the hub. For
// a live Network it claims an address block (an IPClaim with reclaimPolicy
// Retain, in the platform's one namespace) and writes the
// NetworkFabricIdentity derived from it. For a gone Network it deletes the
// fabric identity, unplaces it and releases the claim, so the claim's quota unit
// returns while the Retain allocation keeps the block from ever being
// reissued.
//
// The rules a caller must know: a network is collected only after a direct
// read past the cache says it is gone, and a failed read collects nothing; a
// claim is deleted only with its UID as precondition and only when its
// allocation is recorded Retain; a claim not named fabric-identity.* is never
// touched; a returning network name adopts its retained block. The direct
// read may be one consistent LIST answering for many networks at once, and
// the claim and its allocation may come from informers, in which case the
// delete carries the claim's resourceVersion too, so that it removes exactly
// the claim seen (docs/hub.md says why each read is or is not made). Every
// write is held by a Fence first. The package knows client-go, and nothing
// of the node.
package hubctl

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
)

// Sentinel errors of the API the controller uses.
var (
	ErrNotFound = errors.New("not found")
	// ErrExists: the object to create exists already; nothing was written.
	ErrExists = errors.New("already exists")
	// ErrQuota: the platform's quota on claims refused a new claim (403).
	ErrQuota = errors.New("quota on claims exceeded")
	// ErrPrecondition: the object's UID differs from the one read (409):
	// it was re-created, and the new one is not the caller's to touch.
	ErrPrecondition = errors.New("precondition failed: object was re-created")
	// ErrChanged: the object's UID is the one read but its resourceVersion
	// is not (409): it changed since, and what was decided on the old
	// version must be decided again on a fresh read.
	ErrChanged = errors.New("precondition failed: object changed since it was read")
	// ErrRefused: the API server refused the request for a reason other
	// than those above (403, 422).
	ErrRefused = errors.New("refused")
	// ErrConflict: a create answered 409 Conflict with no cause the
	// controller can read (ipam at 012be054 and a41cd6f1 answer so for a
	// name whose allocation is retained, or retained but unfit). What it
	// means is decided by reading the allocation, never the message.
	ErrConflict = errors.New("conflict")
	// ErrExhausted: the address service has no block left to give (507
	// InsufficientStorage, ipam's registryerrors.NewPoolExhausted).
	ErrExhausted = errors.New("address pool exhausted")
)

// ConfigError is a refusal that no retry mends until someone changes the
// configuration of the hub or of the address service: a class or prefix
// the service will not give (400), a request it finds invalid (422), a
// write it forbids (403: credentials, an unscoped write), a namespace
// missing or terminating. Cause is a short, fixed label for metrics and
// events.
type ConfigError struct {
	Cause string
	Err   error
}

func (e *ConfigError) Error() string {
	return "refused by configuration (" + e.Cause + "): " + e.Err.Error()
}
func (e *ConfigError) Unwrap() error { return e.Err }

// Causes of ConfigError, the values of the cause label.
const (
	CauseBadRequest           = "bad_request"           // 400: no default class, prefix outside the class, scope required, unknown class
	CauseInvalid              = "invalid"               // 422: the claim fails validation
	CauseForbidden            = "forbidden"             // 403 other than quota: credentials, class access, an unscoped write
	CauseNamespaceMissing     = "namespace_missing"     // the platform namespace does not exist
	CauseNamespaceTerminating = "namespace_terminating" // the platform namespace is being deleted
	CauseConflict             = "conflict"              // 409 with no retained allocation to adopt: a retained block that does not fit
)

// AllocationRetainedError is the address service's answer to a claim whose
// name already has a retained allocation (409, cause AllocationRetained):
// the caller adopts that allocation instead of claiming a second block.
type AllocationRetainedError struct {
	Allocation string
}

func (e *AllocationRetainedError) Error() string {
	return fmt.Sprintf("allocation %s is retained for this claim name", e.Allocation)
}

// Network is a hub Network as the controller needs it.
type Network struct {
	Namespace, Name string
	UID             types.UID
	// Deleting: it has a deletionTimestamp; its finalizers tear it down.
	Deleting bool
}

// FabricIdentity is a NetworkFabricIdentity: the object that gives a
// network its fabric ID.
type FabricIdentity struct {
	Namespace, Name string
	// FabricID is its spec.identity: the network's number on the fabric,
	// the 32 bits of its claim's /64 (FabricIDFromBlock). Not a tenant
	// tap's (VPC, attachment) identity.Identity.
	FabricID   uint32
	NetworkRef string
}

// Reclaim policies of claims and allocations.
const (
	PolicyRetain = "Retain"
	PolicyDelete = "Delete"
)

// Claim is an IPClaim.
type Claim struct {
	Namespace, Name string
	UID             types.UID
	ResourceVersion string
	// The network it was made for, from its annotations.
	NetworkNamespace, NetworkName string
	ClassName                     string
	PrefixLength                  int
	ReclaimPolicy                 string
	Phase                         string // Pending, Bound, Releasing, Error
	AllocatedCIDR                 string
	BoundAllocation               string
	// Deleting: the claim's delete was accepted and has not ended: it
	// waits on finalizers (a deletionTimestamp, kube-apiserver), or its
	// phase is Releasing (ipam publishes Releasing and never sets a
	// deletionTimestamp: AllocatingREST.Delete).
	Deleting bool
}

// Allocation is an IPAllocation.
type Allocation struct {
	Namespace, Name string
	ResourceVersion string
	ClaimRef        string // empty once a Retain claim is gone
	ReclaimPolicy   string // fixed when the claim bound: the one that decides
	AllocatedCIDR   string
}

// API is what the controller reads and writes; the kube implementation
// talks to the API server, and tests use a model of the address service.
type API interface {
	// GetNetwork reads past any cache.
	GetNetwork(ctx context.Context, namespace, name string) (Network, error)
	// ListNetworkKeys reads the key of every network past any cache, in one
	// consistent read (a snapshot, however many pages it takes): a network
	// that existed when the read began is in it.
	ListNetworkKeys(ctx context.Context) ([]Key, error)
	GetFabricIdentity(ctx context.Context, namespace, name string) (FabricIdentity, error)
	// CreateFabricIdentity returns ErrExists, and writes nothing, when the
	// fabric identity exists already: fabric identities are immutable.
	CreateFabricIdentity(ctx context.Context, id FabricIdentity) error
	DeleteFabricIdentity(ctx context.Context, namespace, name string) error
	// CreateClaim returns ErrQuota or *AllocationRetainedError as the
	// address service answers.
	CreateClaim(ctx context.Context, c Claim) (Claim, error)
	GetClaim(ctx context.Context, namespace, name string) (Claim, error)
	ListClaims(ctx context.Context, namespace string) ([]Claim, error)
	// DeleteClaim asks to delete only the claim with uid (else
	// ErrPrecondition) and, when resourceVersion is not empty, only at that
	// version (else ErrChanged). It returns the UID of the claim the server
	// says it deleted, or "" when its answer names none. A server that does
	// not check preconditions (ipam's AllocatingREST.Delete) deletes
	// whichever claim holds the name: the UID returned is then how the
	// caller learns it.
	DeleteClaim(ctx context.Context, namespace, name string, uid types.UID, resourceVersion string) (types.UID, error)
	GetAllocation(ctx context.Context, namespace, name string) (Allocation, error)
	ListAllocations(ctx context.Context, namespace string) ([]Allocation, error)
	// Event records an event on a network.
	Event(ctx context.Context, n Network, warning bool, reason, message string)
	// HubEvent records an event about the hub as a whole, on the platform
	// namespace: what holds every release back, not one network's.
	HubEvent(ctx context.Context, warning bool, reason, message string)
	// ClaimEvent records an event about the release of a gone network's
	// claim c, regarding network n while it exists as an object (n not
	// nil), else the claim: a gone network has no object to hang it on.
	ClaimEvent(ctx context.Context, n *Network, c Claim, warning bool, reason, action, message string)
}

// The client rate a hub controller runs at by default: client-go's own 5/s,
// burst 10, kept 150 deletes waiting minutes on the limiter.
const (
	DefaultKubeAPIQPS   = 50
	DefaultKubeAPIBurst = 100
)

// NetworkCache answers from the informer's cache whether a network exists.
type NetworkCache interface {
	Exists(namespace, name string) bool
	// UID is the cached network's UID, for the events recorded on it.
	UID(namespace, name string) (types.UID, bool)
	// Keys lists the cached networks.
	Keys() []Key
	// Len is how many networks are cached: what a LIST of them would
	// return, for choosing between one LIST and a few GETs.
	Len() int
}

// ClaimCache answers from an informer's cache about the claims of the
// platform namespace. A cached claim may be stale: it is acted on only
// through a delete preconditioned on its UID and resourceVersion.
type ClaimCache interface {
	Get(name string) (Claim, bool)
	List() []Claim
}

// AllocationCache answers from an informer's cache about the allocations of
// the platform namespace. An allocation's reclaimPolicy is fixed when its
// claim binds, which is what makes a cached one good enough to release on.
type AllocationCache interface {
	Get(name string) (Allocation, bool)
	List() []Allocation
}

// IdentityCache answers from an informer's cache about fabric identities.
// Whoever feeds it must tell the controller of every change
// (Controller.IdentityChanged), since the controller skips a read or a
// delete on its word.
type IdentityCache interface {
	Get(namespace, name string) (FabricIdentity, bool)
}
