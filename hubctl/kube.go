package hubctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
)

// Resources the controller reads and writes.
var (
	NetworkResource        = schema.GroupVersionResource{Group: "networking.datumapis.com", Version: "v1alpha", Resource: "networks"}
	FabricIdentityResource = schema.GroupVersionResource{Group: "cloud.datumapis.com", Version: "v1alpha1", Resource: "networkfabricidentities"}
	ClaimResource          = schema.GroupVersionResource{Group: "ipam.miloapis.com", Version: "v1alpha1", Resource: "ipclaims"}
	AllocationResource     = schema.GroupVersionResource{Group: "ipam.miloapis.com", Version: "v1alpha1", Resource: "ipallocations"}
)

// Annotations a claim carries to name its network, since a hashed claim
// name cannot be read back.
const (
	AnnotationNetworkNamespace = "galactic.datum.net/network-namespace"
	AnnotationNetworkName      = "galactic.datum.net/network-name"
)

// Kube is the API over a real API server.
type Kube struct {
	rc          rest.Interface
	dyn         dynamic.Interface
	platform    string
	broadcaster events.EventBroadcaster
	recorder    events.EventRecorder
	stop        context.CancelFunc
}

// NewRESTClient returns the one client the controller's requests share, so
// that they share one rate limiter: wrap it with dynamic.New for the
// informers. It speaks JSON and decodes into unstructured objects, as the
// dynamic client does.
func NewRESTClient(cfg *rest.Config) (rest.Interface, error) {
	c := dynamic.ConfigFor(cfg)
	c.GroupVersion = nil
	// Every request names its path in full (AbsPath), as the dynamic
	// client's do.
	c.APIPath = "/"
	return rest.UnversionedRESTClientFor(c)
}

// NewKube returns the API over rc (NewRESTClient), recording events
// through cs as source; events about the hub as a whole go on the platform
// namespace. Events are written as events.k8s.io/v1 Events, whose
// broadcaster turns a repeat (same regarding object, reason, action and
// type) into one Event with a growing series instead of a new object each
// time: a create, one patch when it first repeats, then a patch at most
// every 30 minutes while it goes on. The events.k8s.io broadcaster is
// used directly rather than through events.NewEventBroadcasterAdapter,
// which asks discovery at construction and silently falls back to core/v1
// when the group is not served: the group is GA since 1.19, and one
// recorder means one RBAC rule to grant. Call Shutdown to stop it.
func NewKube(rc rest.Interface, cs kubernetes.Interface, platform, source string) *Kube {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
	ctx, stop := context.WithCancel(context.Background())
	b.StartRecordingToSink(ctx.Done())
	return &Kube{rc: rc, dyn: dynamic.New(rc), platform: platform, broadcaster: b, stop: stop,
		recorder: b.NewRecorder(scheme.Scheme, source)}
}

// Dynamic is the dynamic client over the Kube's REST client: informers
// built on it share the Kube's rate limiter.
func (k *Kube) Dynamic() dynamic.Interface { return k.dyn }

// Shutdown stops recording events: events recorded but not yet written
// may be lost, as they may be on any restart.
func (k *Kube) Shutdown() {
	k.stop()
	k.broadcaster.Shutdown()
}

// mapErr turns API errors into this package's sentinels, keeping the
// original for its message. Refusals are told apart by status code and
// reason first; a message is read only where two refusals share both
// (every quota refusal is 403 Forbidden, as is an RBAC denial).
func mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case apierrors.IsForbidden(err) && quotaRefusal(err):
		return fmt.Errorf("%w: %w", ErrQuota, err)
	case apierrors.IsConflict(err) && preconditionFailed(err, "UID"):
		return fmt.Errorf("%w: %w", ErrPrecondition, err)
	case apierrors.IsConflict(err) && preconditionFailed(err, "ResourceVersion"):
		return fmt.Errorf("%w: %w", ErrChanged, err)
	case statusCode(err) == http.StatusInsufficientStorage:
		return fmt.Errorf("%w: %w", ErrExhausted, err)
	case apierrors.IsForbidden(err), apierrors.IsInvalid(err), apierrors.IsAlreadyExists(err), apierrors.IsMethodNotSupported(err):
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	return err
}

// statusCode is the HTTP status of an API error, 0 for another error.
func statusCode(err error) int32 {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return 0
	}
	return status.Status().Code
}

// quotaMarkers are what each quota admission says in its 403 when it
// refuses for want of quota, and nothing else it says does:
// kube-apiserver's ResourceQuota admission ("exceeded quota: …"), and
// Milo's quota admission as ipam runs it (pkg/quota/admission/plugin.go,
// userFacingClaimError: "Insufficient quota resources available…" in the
// wording the hub was first fed, "You've reached your quota…" in the
// newest). Milo answers every other failure 403 as well (the grant timed
// out, a stale claim being cleaned up, its own misconfiguration): those
// are not the quota being full, and a freed unit mends none of them.
var quotaMarkers = []string{"exceeded quota", "Insufficient quota resources available", "You've reached your quota"}

func quotaRefusal(err error) bool {
	msg := err.Error()
	for _, m := range quotaMarkers {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// classifyCreate sorts a claim create's refusal: configuration (*ConfigError,
// a retry mends nothing until someone changes it), exhaustion
// (ErrExhausted), quota (ErrQuota), a conflict to be read (ErrConflict);
// anything else is returned as mapErr has it, and backed off as transient.
func classifyCreate(err error) error {
	mapped := mapErr(err)
	config := func(cause string) error { return &ConfigError{Cause: cause, Err: mapped} }
	msg := err.Error()
	switch {
	case errors.Is(mapped, ErrQuota), errors.Is(mapped, ErrExhausted):
		return mapped
	case apierrors.IsAlreadyExists(err):
		return mapped
	case apierrors.IsConflict(err):
		return fmt.Errorf("%w: %w", ErrConflict, err)
	// kube-apiserver's NamespaceLifecycle answers a create in a missing
	// namespace 404 with the namespace's details; ipam's RefuseNamespace
	// answers 403 "namespace … does not exist" (internal/access/namespace.go).
	case apierrors.IsNotFound(err) && notFoundKind(err) == "namespaces",
		apierrors.IsForbidden(err) && strings.Contains(msg, "namespace ") && strings.Contains(msg, " does not exist"):
		return config(CauseNamespaceMissing)
	case apierrors.IsForbidden(err) && strings.Contains(msg, "because it is being terminated"):
		return config(CauseNamespaceTerminating)
	case apierrors.IsBadRequest(err):
		return config(CauseBadRequest)
	case apierrors.IsInvalid(err):
		return config(CauseInvalid)
	case apierrors.IsForbidden(err):
		if transientQuotaFailure(msg) {
			return mapped
		}
		return config(CauseForbidden)
	}
	return mapped
}

// notFoundKind is the kind (resource) a 404 names.
func notFoundKind(err error) string {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return ""
	}
	return status.Status().Details.Kind
}

// transientQuotaFailure: Milo's quota admission answers 403 when it could
// not decide in time or is still cleaning up an earlier attempt
// (userFacingClaimError); a retry mends both.
func transientQuotaFailure(msg string) bool {
	return strings.Contains(msg, "took too long to be checked against your quota") ||
		strings.Contains(msg, "still cleaning up from a previous attempt") ||
		strings.Contains(msg, "went wrong while checking your quota")
}

// preconditionFailed reports whether a 409 is a delete's failed precondition
// on field (UID or ResourceVersion). The status carries no cause to tell
// them apart, only its message, which kube-apiserver words two ways: "the
// UID in the precondition (…) does not match …" when the registry checks
// before deleting (rest.BeforeDelete), "Precondition failed: UID in
// precondition: …" when storage checks it (storage.Preconditions.Check, the
// path of an object with finalizers). Both check the UID first, so an
// object re-created reads as re-created even when both differ.
func preconditionFailed(err error, field string) bool {
	msg := err.Error()
	return strings.Contains(msg, "the "+field+" in the precondition") || strings.Contains(msg, "Precondition failed: "+field)
}

func (k *Kube) get(ctx context.Context, gvr schema.GroupVersionResource, ns, name string) (*unstructured.Unstructured, error) {
	u, err := k.dyn.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	return u, mapErr(err)
}

// GetNetwork implements API with a direct read.
func (k *Kube) GetNetwork(ctx context.Context, ns, name string) (Network, error) {
	u, err := k.get(ctx, NetworkResource, ns, name)
	if err != nil {
		return Network{}, err
	}
	return Network{Namespace: ns, Name: name, UID: u.GetUID(), Deleting: u.GetDeletionTimestamp() != nil}, nil
}

// listPageSize is how many networks one page of ListNetworkKeys asks for:
// large enough that a hub of a few hundred networks is one request, small
// enough that no response is huge.
const listPageSize = 500

// ListNetworkKeys implements API with a paginated LIST at resourceVersion
// "": a quorum read of etcd (or of a watch cache proven as fresh), whose
// continue pages are served from the same snapshot. It goes through the
// dynamic client, whose rate limiter the deletes share, rather than a
// metadata-only client with a limiter of its own.
func (k *Kube) ListNetworkKeys(ctx context.Context) ([]Key, error) {
	ri := k.dyn.Resource(NetworkResource).Namespace(metav1.NamespaceAll)
	opts := metav1.ListOptions{Limit: listPageSize}
	var keys []Key
	for {
		list, err := ri.List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list networks: %w", mapErr(err))
		}
		for i := range list.Items {
			keys = append(keys, Key{list.Items[i].GetNamespace(), list.Items[i].GetName()})
		}
		if list.GetContinue() == "" {
			return keys, nil
		}
		opts.Continue = list.GetContinue()
	}
}

// GetFabricIdentity implements API.
func (k *Kube) GetFabricIdentity(ctx context.Context, ns, name string) (FabricIdentity, error) {
	u, err := k.get(ctx, FabricIdentityResource, ns, name)
	if err != nil {
		return FabricIdentity{}, err
	}
	return identityFrom(u), nil
}

func identityFrom(u *unstructured.Unstructured) FabricIdentity {
	id, _, _ := unstructured.NestedInt64(u.Object, "spec", "identity")
	ref, _, _ := unstructured.NestedString(u.Object, "spec", "networkRef", "name")
	return FabricIdentity{Namespace: u.GetNamespace(), Name: u.GetName(), FabricID: uint32(id), NetworkRef: ref}
}

// CreateFabricIdentity implements API; an identity that exists already is kept
// and ErrExists returned, so that the caller counts only what it wrote.
func (k *Kube) CreateFabricIdentity(ctx context.Context, id FabricIdentity) error {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cloud.datumapis.com/v1alpha1", "kind": "NetworkFabricIdentity",
		"metadata": map[string]any{"namespace": id.Namespace, "name": id.Name},
		"spec":     map[string]any{"identity": int64(id.FabricID), "networkRef": map[string]any{"name": id.NetworkRef}},
	}}
	_, err := k.dyn.Resource(FabricIdentityResource).Namespace(id.Namespace).Create(ctx, u, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create fabric identity %s/%s: %w: %w", id.Namespace, id.Name, ErrExists, err)
	}
	return mapErr(err)
}

// DeleteFabricIdentity implements API.
func (k *Kube) DeleteFabricIdentity(ctx context.Context, ns, name string) error {
	return mapErr(k.dyn.Resource(FabricIdentityResource).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{}))
}

// CreateClaim implements API.
func (k *Kube) CreateClaim(ctx context.Context, c Claim) (Claim, error) {
	spec := map[string]any{"ipFamily": "IPv6", "prefixLength": int64(c.PrefixLength), "reclaimPolicy": c.ReclaimPolicy}
	if c.ClassName != "" {
		spec["className"] = c.ClassName
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "ipam.miloapis.com/v1alpha1", "kind": "IPClaim",
		"metadata": map[string]any{"namespace": c.Namespace, "name": c.Name, "annotations": map[string]any{
			AnnotationNetworkNamespace: c.NetworkNamespace, AnnotationNetworkName: c.NetworkName,
		}},
		"spec": spec,
	}}
	created, err := k.dyn.Resource(ClaimResource).Namespace(c.Namespace).Create(ctx, u, metav1.CreateOptions{})
	if err != nil {
		if alloc, ok := allocationRetained(err, c.Namespace, c.Name); ok {
			return Claim{}, &AllocationRetainedError{Allocation: alloc}
		}
		return Claim{}, classifyCreate(err)
	}
	return claimFrom(created), nil
}

// allocationRetained recognises the address service's 409 refusal of a
// claim whose name retained an allocation.
func allocationRetained(err error, ns, name string) (string, bool) {
	var status apierrors.APIStatus
	if !apierrors.IsConflict(err) || !errors.As(err, &status) || status.Status().Details == nil {
		return "", false
	}
	for _, cause := range status.Status().Details.Causes {
		if string(cause.Type) == "AllocationRetained" {
			if cause.Field != "" {
				return cause.Field, true
			}
			return AllocationName(ns, name), true
		}
	}
	return "", false
}

func claimFrom(u *unstructured.Unstructured) Claim {
	str := func(fields ...string) string { s, _, _ := unstructured.NestedString(u.Object, fields...); return s }
	prefix, _, _ := unstructured.NestedInt64(u.Object, "spec", "prefixLength")
	ann := u.GetAnnotations()
	bound := str("status", "boundAllocationRef", "name")
	if bound == "" {
		bound = str("status", "boundAllocationRef")
	}
	return Claim{
		Namespace: u.GetNamespace(), Name: u.GetName(), UID: u.GetUID(), ResourceVersion: u.GetResourceVersion(),
		NetworkNamespace: ann[AnnotationNetworkNamespace], NetworkName: ann[AnnotationNetworkName],
		ClassName: str("spec", "className"), PrefixLength: int(prefix), ReclaimPolicy: str("spec", "reclaimPolicy"),
		Phase: str("status", "phase"), AllocatedCIDR: str("status", "allocatedCIDR"), BoundAllocation: bound,
		Deleting: u.GetDeletionTimestamp() != nil || str("status", "phase") == PhaseReleasing,
	}
}

// GetClaim implements API.
func (k *Kube) GetClaim(ctx context.Context, ns, name string) (Claim, error) {
	u, err := k.get(ctx, ClaimResource, ns, name)
	if err != nil {
		return Claim{}, err
	}
	return claimFrom(u), nil
}

// ListClaims implements API.
func (k *Kube) ListClaims(ctx context.Context, ns string) ([]Claim, error) {
	list, err := k.dyn.Resource(ClaimResource).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, mapErr(err)
	}
	out := make([]Claim, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, claimFrom(&list.Items[i]))
	}
	return out, nil
}

// PhaseReleasing is the phase ipam publishes on a claim it is deleting,
// in place of a deletionTimestamp.
const PhaseReleasing = "Releasing"

// DeleteClaim implements API with a UID precondition, and a resourceVersion
// one when resourceVersion is not empty. It reads the server's answer for
// the claim it deleted: kube-apiserver answers the deleted object (or a
// Status, for a delete of an object already gone), ipam the claim it
// deleted, in phase Releasing, whatever the preconditions said
// (AllocatingREST.Delete returns `releasing, true, nil`).
func (k *Kube) DeleteClaim(ctx context.Context, ns, name string, uid types.UID, resourceVersion string) (types.UID, error) {
	pre := &metav1.Preconditions{UID: &uid}
	if resourceVersion != "" {
		pre.ResourceVersion = &resourceVersion
	}
	body, err := runtime.Encode(unstructured.UnstructuredJSONScheme, &metav1.DeleteOptions{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "DeleteOptions"}, Preconditions: pre})
	if err != nil {
		return "", fmt.Errorf("encode delete options: %w", err)
	}
	res := k.rc.Delete().AbsPath("/apis", ClaimResource.Group, ClaimResource.Version, "namespaces", ns, ClaimResource.Resource, name).
		SetHeader("Content-Type", runtime.ContentTypeJSON).Body(body).Do(ctx)
	raw, err := res.Raw()
	if err != nil {
		// Error, not Raw's error, decodes the Status the server sent.
		return "", mapErr(res.Error())
	}
	return deletedUID(raw), nil
}

// deletedUID is the UID of the claim a DELETE answered: the object's own
// (ipam, and a kube-apiserver store that returns deleted objects), or the
// Status's details (kube-apiserver's generic store, CRDs among them:
// finalizeDelete), "" when the answer names none.
func deletedUID(raw []byte) types.UID {
	var answer struct {
		Kind     string `json:"kind"`
		Metadata struct {
			UID types.UID `json:"uid"`
		} `json:"metadata"`
		Details struct {
			UID types.UID `json:"uid"`
		} `json:"details"`
	}
	if json.Unmarshal(raw, &answer) != nil {
		return ""
	}
	if answer.Kind == "Status" {
		return answer.Details.UID
	}
	return answer.Metadata.UID
}

// GetAllocation implements API.
func (k *Kube) GetAllocation(ctx context.Context, ns, name string) (Allocation, error) {
	u, err := k.get(ctx, AllocationResource, ns, name)
	if err != nil {
		return Allocation{}, err
	}
	return allocationFrom(u), nil
}

func allocationFrom(u *unstructured.Unstructured) Allocation {
	str := func(fields ...string) string { s, _, _ := unstructured.NestedString(u.Object, fields...); return s }
	return Allocation{Namespace: u.GetNamespace(), Name: u.GetName(), ResourceVersion: u.GetResourceVersion(),
		ClaimRef: str("spec", "claimRef", "name"), ReclaimPolicy: str("spec", "reclaimPolicy"), AllocatedCIDR: str("status", "allocatedCIDR")}
}

// ListAllocations implements API.
func (k *Kube) ListAllocations(ctx context.Context, ns string) ([]Allocation, error) {
	list, err := k.dyn.Resource(AllocationResource).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, mapErr(err)
	}
	out := make([]Allocation, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, allocationFrom(&list.Items[i]))
	}
	return out, nil
}

// HubEvent implements API: the event goes on the platform namespace.
func (k *Kube) HubEvent(_ context.Context, warning bool, reason, message string) {
	k.record(&corev1.ObjectReference{APIVersion: "v1", Kind: "Namespace", Name: k.platform, Namespace: k.platform}, nil,
		warning, reason, actionOf(reason), message)
}

// Event implements API. Recording is asynchronous and never fails the
// caller: events are for people.
func (k *Kube) Event(_ context.Context, n Network, warning bool, reason, message string) {
	k.record(networkReference(n), nil, warning, reason, actionOf(reason), message)
}

// ClaimEvent implements API: regarding the network while it exists as an
// object, with the claim as related, else the claim itself, which is what
// is left of a gone network.
func (k *Kube) ClaimEvent(_ context.Context, n *Network, c Claim, warning bool, reason, action, message string) {
	claim := &corev1.ObjectReference{APIVersion: ClaimResource.GroupVersion().String(), Kind: "IPClaim",
		Namespace: c.Namespace, Name: c.Name, UID: c.UID}
	if n == nil {
		k.record(claim, nil, warning, reason, action, message)
		return
	}
	k.record(networkReference(*n), claim, warning, reason, action, message)
}

func networkReference(n Network) *corev1.ObjectReference {
	return &corev1.ObjectReference{APIVersion: NetworkResource.GroupVersion().String(), Kind: "Network",
		Namespace: n.Namespace, Name: n.Name, UID: n.UID}
}

// noteLimit is what the API server accepts of an events.k8s.io/v1 note
// (validation's NoteLengthLimit); a longer one is refused and the event
// lost, and refusals quote API errors of any length.
const noteLimit = 1024

func (k *Kube) record(regarding, related *corev1.ObjectReference, warning bool, reason, action, note string) {
	typ := corev1.EventTypeNormal
	if warning {
		typ = corev1.EventTypeWarning
	}
	if len(note) > noteLimit {
		note = strings.ToValidUTF8(note[:noteLimit-len("…")], "") + "…"
	}
	// A nil *ObjectReference in the interface would not be nil to the
	// recorder, which then fails to reference it.
	var rel runtime.Object
	if related != nil {
		rel = related
	}
	// The note goes as an argument: a message may hold a % of its own.
	k.recorder.Eventf(regarding, rel, typ, reason, action, "%s", note)
}

// actionOf is the action (what the hub was doing) of the events the
// controller and placement record through Event and HubEvent, which
// events.k8s.io/v1 requires and core/v1 had no field for.
func actionOf(reason string) string {
	switch reason {
	case "FabricIdentityQuotaExceeded", "FabricIdentityClaimMisconfigured", "FabricIdentityPoolExhausted",
		"FabricIdentityClaimRestored":
		return "Claim"
	case "FabricIdentityPlaced", "FabricIdentityPlacementRefused":
		return "Place"
	case "FabricIdentityUnplaced", "FabricIdentityWithdrawalHeld":
		return "Unplace"
	case "FabricIdentityReleasesHeld", "FabricIdentityReleasesResumed", ReasonClaimReleased, ReasonClaimReleaseRefused:
		return ActionRelease
	}
	return "Reconcile"
}

// newInformer returns an informer over ri whose cache keeps of each object
// only what trim returns, so that a hub with thousands of objects caches
// little. With relist above 0 it lists ri afresh at least that often
// (relisting).
func newInformer(ri listWatcher, what string, trim cache.TransformFunc, relist time.Duration) (cache.SharedIndexInformer, error) {
	r := &relisting{every: relist, what: what}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			list, err := ri.List(ctx, o)
			if err == nil {
				r.listed()
			}
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			if err := r.bound(&o); err != nil {
				return nil, err
			}
			return ri.Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformerWithOptions(lw, &unstructured.Unstructured{}, cache.SharedIndexInformerOptions{ObjectDescription: what, Indexers: cache.Indexers{}})
	if err := inf.SetTransform(trim); err != nil {
		return nil, fmt.Errorf("%s informer: %w", what, err)
	}
	if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, rf *cache.Reflector, err error) {
		if errors.Is(err, errRelistDue) {
			return // not a fault: the relist it asks for is on its way
		}
		cache.DefaultWatchErrorHandler(ctx, rf, err)
	}); err != nil {
		return nil, fmt.Errorf("%s informer: %w", what, err)
	}
	return inf, nil
}

// errRelistDue ends an informer's watch so that its reflector lists again.
var errRelistDue = errors.New("relist due")

// relisting makes an informer list afresh at least every so often, not
// only when its watch is refused with 410 Expired. A server that resumes a
// watch from a resourceVersion it no longer holds without saying so (ipam
// before a41cd6f1: internal/watch/postgres.go, seedCursorFromRV, with a
// changelog of 5 minutes) gives the informer no reason to relist, and an
// event missed then (a claim's DELETED) stays missed until the process
// restarts. A relist replaces the cache and reports what it lacked as
// deleted, so a missed event is seen at most one interval after it happened, plus
// one LIST. Each watch is asked to end when the next relist is due
// (timeoutSeconds), and the watch after it is refused with errRelistDue,
// which makes client-go's reflector list again.
type relisting struct {
	every time.Duration
	what  string

	mu   sync.Mutex
	last time.Time
}

func (r *relisting) listed() {
	r.mu.Lock()
	r.last = time.Now()
	r.mu.Unlock()
}

// bound shortens the watch o asks for to end when the next relist is due,
// or refuses it when that is now. A watch that sends the initial events
// (client-go's watch-list) is itself a list.
func (r *relisting) bound(o *metav1.ListOptions) error {
	if r.every <= 0 {
		return nil
	}
	if o.SendInitialEvents != nil && *o.SendInitialEvents {
		r.listed()
	}
	r.mu.Lock()
	left := time.Until(r.last.Add(r.every))
	r.mu.Unlock()
	if left <= 0 {
		return fmt.Errorf("%s: watch ended after %s: %w", r.what, r.every, errRelistDue)
	}
	secs := int64(math.Ceil(left.Seconds()))
	if o.TimeoutSeconds == nil || *o.TimeoutSeconds > secs {
		o.TimeoutSeconds = &secs
	}
	return nil
}

// trimmed is u with its identifying metadata (namespace, name, uid,
// resourceVersion, deletionTimestamp) and the fields at paths, nothing else.
func trimmed(u *unstructured.Unstructured, paths ...[]string) *unstructured.Unstructured {
	meta := map[string]any{"namespace": u.GetNamespace(), "name": u.GetName(), "uid": string(u.GetUID()),
		"resourceVersion": u.GetResourceVersion()}
	if ts := u.GetDeletionTimestamp(); ts != nil {
		meta["deletionTimestamp"] = ts.UTC().Format(time.RFC3339)
	}
	out := &unstructured.Unstructured{Object: map[string]any{"apiVersion": u.GetAPIVersion(), "kind": u.GetKind(), "metadata": meta}}
	for _, p := range paths {
		if v, ok, _ := unstructured.NestedFieldNoCopy(u.Object, p...); ok {
			// Decoded JSON values only, which SetNestedField copies safely.
			_ = unstructured.SetNestedField(out.Object, v, p...)
		}
	}
	return out
}

// trimWith turns a trimming of unstructured objects into a TransformFunc;
// other objects (the informer's tombstones) pass as they are.
func trimWith(trim func(*unstructured.Unstructured) *unstructured.Unstructured) cache.TransformFunc {
	return func(obj any) (any, error) {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			return trim(u), nil
		}
		return obj, nil
	}
}

// cached returns the unstructured object under key in inf's cache.
func cached(inf cache.SharedIndexInformer, key string) (*unstructured.Unstructured, bool) {
	obj, ok, err := inf.GetIndexer().GetByKey(key)
	if !ok || err != nil {
		return nil, false
	}
	u, isU := obj.(*unstructured.Unstructured)
	return u, isU
}

// keyHandler calls on with the namespace and name of every object added,
// updated or deleted (a tombstone's too).
func keyHandler(on func(namespace, name string)) cache.ResourceEventHandler {
	onChange := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			ns, name, _ := cache.SplitMetaNamespaceKey(key)
			on(ns, name)
		}
	}
	return cache.ResourceEventHandlerFuncs{AddFunc: onChange, UpdateFunc: func(_, n any) { onChange(n) }, DeleteFunc: onChange}
}

// NetworkInformer watches Networks, keeps only their keys, and calls
// enqueue for every change; it is the controller's NetworkCache.
type NetworkInformer struct {
	informer cache.SharedIndexInformer
}

// NewNetworkInformer returns an informer over networks in all namespaces.
func NewNetworkInformer(dyn dynamic.Interface, enqueue func(namespace, name string)) (*NetworkInformer, error) {
	inf, err := newInformer(dyn.Resource(NetworkResource).Namespace(metav1.NamespaceAll), "networks", func(obj any) (any, error) {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: u.GetNamespace(), Name: u.GetName(), UID: u.GetUID(),
				ResourceVersion: u.GetResourceVersion(), DeletionTimestamp: u.GetDeletionTimestamp()}}, nil
		}
		return obj, nil
	}, 0)
	if err != nil {
		return nil, err
	}
	if _, err := inf.AddEventHandler(keyHandler(enqueue)); err != nil {
		return nil, err
	}
	return &NetworkInformer{informer: inf}, nil
}

// Run runs the informer until ctx ends.
func (n *NetworkInformer) Run(ctx context.Context) { n.informer.RunWithContext(ctx) }

// HasSynced reports whether the initial list has been read.
func (n *NetworkInformer) HasSynced() bool { return n.informer.HasSynced() }

// Keys implements NetworkCache.
func (n *NetworkInformer) Keys() []Key {
	keys := n.informer.GetIndexer().ListKeys()
	out := make([]Key, 0, len(keys))
	for _, k := range keys {
		if ns, name, err := cache.SplitMetaNamespaceKey(k); err == nil {
			out = append(out, Key{ns, name})
		}
	}
	return out
}

// Len implements NetworkCache.
func (n *NetworkInformer) Len() int { return len(n.informer.GetIndexer().ListKeys()) }

// UID implements NetworkCache.
func (n *NetworkInformer) UID(ns, name string) (types.UID, bool) {
	obj, ok, err := n.informer.GetIndexer().GetByKey(ns + "/" + name)
	if !ok || err != nil {
		return "", false
	}
	m, isMeta := obj.(metav1.Object)
	if !isMeta {
		return "", false
	}
	return m.GetUID(), true
}

// Deleting reports whether the cached network namespace/name has a
// deletionTimestamp: its finalizers are tearing it down.
func (n *NetworkInformer) Deleting(ns, name string) bool {
	obj, ok, err := n.informer.GetIndexer().GetByKey(ns + "/" + name)
	if !ok || err != nil {
		return false
	}
	m, isMeta := obj.(metav1.Object)
	return isMeta && m.GetDeletionTimestamp() != nil
}

// Exists implements NetworkCache.
func (n *NetworkInformer) Exists(ns, name string) bool {
	_, ok, err := n.informer.GetIndexer().GetByKey(ns + "/" + name)
	return ok && err == nil
}

// ClaimInformer watches the claims in the platform namespace, so that a
// network learns at once that its claim was bound, and networks refused for
// quota learn at once that a unit was freed, instead of waiting out their
// backoff. It is the controller's ClaimCache too: it keeps what a release
// decides on (uid, resourceVersion, phase, bound allocation, block, policy,
// the network annotations, deletionTimestamp), and nothing else.
type ClaimInformer struct {
	informer  cache.SharedIndexInformer
	namespace string
}

// ClaimEvents are what a ClaimInformer reports.
type ClaimEvents struct {
	// Bound is called when the claim of network namespace/name is seen
	// bound.
	Bound func(namespace, name string)
	// Gone is called when a claim is deleted: a quota unit may be free.
	Gone func()
}

// NewClaimInformer returns an informer over the claims in namespace that
// lists them afresh at least every relist (0: only when its watch is
// refused), for an address service that may resume a watch without the
// events it missed (relisting).
func NewClaimInformer(dyn dynamic.Interface, namespace string, on ClaimEvents, relist time.Duration) (*ClaimInformer, error) {
	inf, err := newInformer(dyn.Resource(ClaimResource).Namespace(namespace), "ipclaims", trimWith(trimClaim), relist)
	if err != nil {
		return nil, err
	}
	bound := func(obj any) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok || !strings.HasPrefix(u.GetName(), ClaimPrefix) {
			return
		}
		// A claim being deleted is still Bound until its finalizer goes
		// (ipam shows it Releasing instead); it is no news to its network.
		if phase, _, _ := unstructured.NestedString(u.Object, "status", "phase"); phase != "Bound" || u.GetDeletionTimestamp() != nil {
			return
		}
		c := claimFrom(u)
		ns, name := c.NetworkNamespace, c.NetworkName
		if ns == "" || name == "" {
			if ns, name, ok = NetworkOfClaim(c.Name); !ok {
				return
			}
		}
		on.Bound(ns, name)
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    bound,
		UpdateFunc: func(_, n any) { bound(n) },
		DeleteFunc: func(any) { on.Gone() },
	}); err != nil {
		return nil, fmt.Errorf("claim informer: %w", err)
	}
	return &ClaimInformer{informer: inf, namespace: namespace}, nil
}

// trimClaim keeps of a claim what claimFrom reads.
func trimClaim(u *unstructured.Unstructured) *unstructured.Unstructured {
	out := trimmed(u, []string{"spec", "reclaimPolicy"}, []string{"spec", "prefixLength"}, []string{"spec", "className"},
		[]string{"status", "phase"}, []string{"status", "allocatedCIDR"}, []string{"status", "boundAllocationRef"})
	ann := map[string]string{}
	for _, k := range []string{AnnotationNetworkNamespace, AnnotationNetworkName} {
		if v, ok := u.GetAnnotations()[k]; ok {
			ann[k] = v
		}
	}
	out.SetAnnotations(ann)
	return out
}

// Run runs the informer until ctx ends.
func (c *ClaimInformer) Run(ctx context.Context) { c.informer.RunWithContext(ctx) }

// HasSynced reports whether the initial list has been read.
func (c *ClaimInformer) HasSynced() bool { return c.informer.HasSynced() }

// Len is how many claims are cached.
func (c *ClaimInformer) Len() int { return len(c.informer.GetIndexer().ListKeys()) }

// Get implements ClaimCache.
func (c *ClaimInformer) Get(name string) (Claim, bool) {
	u, ok := cached(c.informer, c.namespace+"/"+name)
	if !ok {
		return Claim{}, false
	}
	return claimFrom(u), true
}

// List implements ClaimCache.
func (c *ClaimInformer) List() []Claim {
	objs := c.informer.GetIndexer().List()
	out := make([]Claim, 0, len(objs))
	for _, obj := range objs {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			out = append(out, claimFrom(u))
		}
	}
	return out
}

// AllocationInformer caches the allocations of the platform namespace: the
// controller's AllocationCache.
type AllocationInformer struct {
	informer  cache.SharedIndexInformer
	namespace string
}

// NewAllocationInformer returns an informer over the allocations in
// namespace that lists them afresh at least every relist (0: only when its
// watch is refused; see relisting).
func NewAllocationInformer(dyn dynamic.Interface, namespace string, relist time.Duration) (*AllocationInformer, error) {
	inf, err := newInformer(dyn.Resource(AllocationResource).Namespace(namespace), "ipallocations", trimWith(func(u *unstructured.Unstructured) *unstructured.Unstructured {
		return trimmed(u, []string{"spec", "claimRef", "name"}, []string{"spec", "reclaimPolicy"}, []string{"status", "allocatedCIDR"})
	}), relist)
	if err != nil {
		return nil, err
	}
	return &AllocationInformer{informer: inf, namespace: namespace}, nil
}

// Run runs the informer until ctx ends.
func (a *AllocationInformer) Run(ctx context.Context) { a.informer.RunWithContext(ctx) }

// HasSynced reports whether the initial list has been read.
func (a *AllocationInformer) HasSynced() bool { return a.informer.HasSynced() }

// Len is how many allocations are cached.
func (a *AllocationInformer) Len() int { return len(a.informer.GetIndexer().ListKeys()) }

// Get implements AllocationCache.
func (a *AllocationInformer) Get(name string) (Allocation, bool) {
	u, ok := cached(a.informer, a.namespace+"/"+name)
	if !ok {
		return Allocation{}, false
	}
	return allocationFrom(u), true
}

// List implements AllocationCache.
func (a *AllocationInformer) List() []Allocation {
	objs := a.informer.GetIndexer().List()
	out := make([]Allocation, 0, len(objs))
	for _, obj := range objs {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			out = append(out, allocationFrom(u))
		}
	}
	return out
}

// FabricIdentityInformer caches the fabric identities of all namespaces
// (their identity and network, nothing else): the controller's
// IdentityCache.
type FabricIdentityInformer struct {
	informer cache.SharedIndexInformer
}

// NewFabricIdentityInformer returns an informer over fabric identities in
// all namespaces that calls changed with the namespace and name of every
// identity added, changed or deleted, once its cache holds the change: the
// controller's IdentityChanged.
func NewFabricIdentityInformer(dyn dynamic.Interface, changed func(namespace, name string)) (*FabricIdentityInformer, error) {
	inf, err := newInformer(dyn.Resource(FabricIdentityResource).Namespace(metav1.NamespaceAll), "networkfabricidentities",
		trimWith(func(u *unstructured.Unstructured) *unstructured.Unstructured {
			t := trimmed(u, []string{"spec", "identity"}, []string{"spec", "networkRef", "name"})
			// Where placement recorded the identity as placed.
			var labels map[string]string
			for k, v := range u.GetLabels() {
				if strings.HasPrefix(k, LabelLocationPrefix) {
					if labels == nil {
						labels = map[string]string{}
					}
					labels[k] = v
				}
			}
			t.SetLabels(labels)
			return t
		}), 0)
	if err != nil {
		return nil, err
	}
	if _, err := inf.AddEventHandler(keyHandler(changed)); err != nil {
		return nil, fmt.Errorf("fabric identity informer: %w", err)
	}
	return &FabricIdentityInformer{informer: inf}, nil
}

// Run runs the informer until ctx ends.
func (f *FabricIdentityInformer) Run(ctx context.Context) { f.informer.RunWithContext(ctx) }

// HasSynced reports whether the initial list has been read.
func (f *FabricIdentityInformer) HasSynced() bool { return f.informer.HasSynced() }

// Len is how many fabric identities are cached.
func (f *FabricIdentityInformer) Len() int { return len(f.informer.GetIndexer().ListKeys()) }

// Get implements IdentityCache.
func (f *FabricIdentityInformer) Get(namespace, name string) (FabricIdentity, bool) {
	u, ok := cached(f.informer, namespace+"/"+name)
	if !ok {
		return FabricIdentity{}, false
	}
	return identityFrom(u), true
}

// DefaultRelistInterval is how often the claim and allocation informers
// list afresh by default (relisting): ipam keeps its watch changelog 5
// minutes, so a watch cut for longer may resume without the events in
// between; relisting as often bounds how long a missed delete stays
// unseen to about 5 minutes, at two LISTs of the platform namespace per
// interval.
const DefaultRelistInterval = 5 * time.Minute
