package ipamtest

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Milo's quota admission refuses a create it has no quota for with a 403
// whose message is one of these.
const (
	// MiloQuotaDenied is the wording of Milo's quota admission
	// (milo-os/milo pkg/quota/admission/plugin.go,
	// handleResourceQuotaEnforcement) before its refusals were split by
	// kind: every failure to be granted a ResourceClaim answers
	// errors.NewForbidden(gr, name, fmt.Errorf(MiloQuotaDenied)).
	MiloQuotaDenied = "Insufficient quota resources available. Review your quota usage and reach out to support if you need additional resources."
	// MiloQuotaDeniedNewest is the Denied wording since then (milo-os/milo
	// pkg/quota/admission/plugin.go userFacingClaimError at 35a82566),
	// formatted with the resource.
	MiloQuotaDeniedNewest = "You've reached your quota for this resource type (%s). Delete unused resources to free up capacity, or contact support to request a higher limit."
)

// quotaDenied is Milo's 403 for a create of the claim name: NewForbidden
// on the request's group and resource, the object's name and the text.
func (s *Service) quotaDenied(name string) *metav1.Status {
	text := MiloQuotaDenied
	if s.opts.NewestQuotaWording {
		text = fmt.Sprintf(MiloQuotaDeniedNewest, claimsGR.Resource)
	}
	return &apierrors.NewForbidden(claimsGR, name, errors.New(text)).ErrStatus
}

// Untenanted is ipam's refusal of a write that carries no project
// (cmd/ipam/admission.go untenantedWriteFilter, read at 20394db6): a 403
// on the bare group, naming the parent-name extra the request lacks
// (internal/tenant/tenant.go ExtraParentName).
func Untenanted() *metav1.Status {
	return &apierrors.NewForbidden(schema.GroupResource{Group: Group}, "", fmt.Errorf(
		"writes must be scoped to a project: this request carries no %s extra, so it has no keyspace to write into. Route the request through Milo's front gate, or use the platform project's credentials for platform-owned objects",
		"iam.miloapis.com/parent-name")).ErrStatus
}

// NoDefaultClass is ipam's 400 for a claim that names an address family
// whose default class the project does not mark
// (internal/allocator/class.go LoadDefaultClass, ErrNoDefaultClass, mapped
// by internal/registry/ipam/ipclaim/storage.go mapClassError to
// NewBadRequest, a41cd6f1): "ipam: no default class for address family: IPv6".
func NoDefaultClass(family string) *metav1.Status {
	return &apierrors.NewBadRequest(fmt.Sprintf("ipam: no default class for address family: %s", family)).ErrStatus
}

// PrefixOutOfRange is ipam's 400 for a prefix length outside the class's
// allowedPrefixLengths (internal/allocator EffectivePrefixLength, mapped by
// internal/registry/ipam/ipclaim/storage.go to NewBadRequest, a41cd6f1).
func PrefixOutOfRange(prefix int, class string, lo, hi int) *metav1.Status {
	return &apierrors.NewBadRequest(fmt.Sprintf("prefixLength %d is outside class %q allowedPrefixLengths [%d, %d]", prefix, class, lo, hi)).ErrStatus
}

// ScopeRequired is ipam's 400 for a claim whose scope lacks a role its
// class's uniqueWithin requires (internal/registry/ipam/ipclaim/storage.go
// checkAgainstClass, a41cd6f1: a
// MissingRoleError becomes NewBadRequest("<error> (class %q)")), e.g.
// `scope is missing role "network" required by uniqueWithin (class "x")`.
func ScopeRequired(role, class string) *metav1.Status {
	return &apierrors.NewBadRequest(fmt.Sprintf("scope is missing role %q required by uniqueWithin (class %q)", role, class)).ErrStatus
}

// PoolExhausted is ipam's 507 for a pool that cannot satisfy the claim
// (internal/registry/ipam/ipclaim/storage.go exhaustionError →
// internal/registry/ipam/registryerrors NewPoolExhausted; message from
// internal/allocator/interface.go; a41cd6f1. At 012be054 NewPoolExhausted
// took the pool only, `IPPool %q is exhausted`, Kind "ippools"): not a
// NewGenericServerResponse but a StatusError of its own, Reason
// "InsufficientStorage", the pool in Details and the figures as causes
// keyed className, poolName, requestedPrefixLength, largestFreePrefix and
// utilizationPercent (Type and Field the key, Message the value). pool is
// the pool's storage key, as ipam quotes it. The class is not a parameter,
// so its cause carries an empty message.
func PoolExhausted(pool string, prefix, largest int, util float64) *metav1.Status {
	cause := func(key, value string) metav1.StatusCause {
		return metav1.StatusCause{Type: metav1.CauseType(key), Message: value, Field: key}
	}
	return &metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    http.StatusInsufficientStorage,
		Reason:  metav1.StatusReason("InsufficientStorage"),
		Message: fmt.Sprintf("ipam: pool %q cannot satisfy a /%d (largest free /%d, %g%% utilized)", pool, prefix, largest, util),
		Details: &metav1.StatusDetails{
			Name: pool, Group: Group, Kind: "IPPool",
			Causes: []metav1.StatusCause{
				cause("className", ""),
				cause("poolName", pool),
				cause("requestedPrefixLength", strconv.Itoa(prefix)),
				cause("largestFreePrefix", strconv.Itoa(largest)),
				cause("utilizationPercent", fmt.Sprintf("%g", util)),
			},
		},
	}
}

// NamespaceMissing is ipam's 403 for a create into a namespace that does
// not exist in the project (internal/access/namespace.go RefuseNamespace,
// a41cd6f1).
func NamespaceMissing(ns string) *metav1.Status {
	return &apierrors.NewForbidden(claimsGR, "", fmt.Errorf("namespace %s does not exist: an address bound into it would have nothing to collect it", ns)).ErrStatus
}

// NamespaceTerminating is ipam's 403 for a create into a namespace being
// deleted (internal/access/namespace.go RefuseNamespace, a41cd6f1).
func NamespaceTerminating(ns string) *metav1.Status {
	return &apierrors.NewForbidden(claimsGR, "", fmt.Errorf("unable to create new content in namespace %s because it is being terminated: an address bound into a terminating namespace would outlive everything that could release it", ns)).ErrStatus
}

// errRetainedMismatch is ipam's ErrRetainedMismatch
// (internal/allocator/reclaim.go, a41cd6f1), which every refusal of a
// retained or bound allocation wraps.
var errRetainedMismatch = errors.New("ipam: retained allocation does not match this claim")

// retainedConflict is the 409 a create of name meets when its allocation
// alloc is retained and mode does not re-bind it.
func retainedConflict(mode Retained, name, alloc string) *metav1.Status {
	// internal/registry/ipam/ipclaim/storage.go retainedAllocationConflict
	// at 012be054.
	msg := fmt.Sprintf("an allocation under this identity already exists: IPAllocation %q, retained by an earlier claim of the same name; delete it to reuse the name", alloc)
	st := apierrors.NewConflict(claimsGR, name, errors.New(msg)).ErrStatus
	if mode == RetainedCauseConflict {
		// pkg/ipamerrors NewRetainedAllocation (read at a9e82b7f; no server
		// path calls it at a41cd6f1) stamps the reason on the conflict
		// client-go would build; the seed's contract names the allocation
		// in the cause's Field too.
		if st.Details == nil {
			st.Details = &metav1.StatusDetails{}
		}
		st.Details.Causes = []metav1.StatusCause{{Type: "AllocationRetained", Message: alloc, Field: alloc}}
	}
	return &st
}

// mismatch is the 409 of a retained allocation that does not fit the claim
// (internal/registry/ipam/ipclaim/storage.go maps every ErrRetainedMismatch
// with NewConflict(v1alpha1.Resource("ipclaims"), claim.Name, err),
// a41cd6f1).
func mismatch(name string, err error) *metav1.Status {
	return &apierrors.NewConflict(claimsGR, name, err).ErrStatus
}
