package hubctl

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
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
	dyn         dynamic.Interface
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
}

// NewKube returns the API over dyn, recording events through cs as source.
// Events go through client-go's recorder, whose correlator turns a repeated
// event into one Event with a growing count instead of a new object each
// time; call Shutdown to flush and stop it.
func NewKube(dyn dynamic.Interface, cs kubernetes.Interface, source string) *Kube {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	return &Kube{dyn: dyn, broadcaster: b, recorder: b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: source})}
}

// Shutdown stops recording events.
func (k *Kube) Shutdown() { k.broadcaster.Shutdown() }

// mapErr turns API errors into this package's sentinels, keeping the
// original for its message.
func mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota"):
		return fmt.Errorf("%w: %w", ErrQuota, err)
	case apierrors.IsConflict(err) && preconditionFailed(err, "UID"):
		return fmt.Errorf("%w: %w", ErrPrecondition, err)
	case apierrors.IsConflict(err) && preconditionFailed(err, "ResourceVersion"):
		return fmt.Errorf("%w: %w", ErrChanged, err)
	case apierrors.IsForbidden(err), apierrors.IsInvalid(err), apierrors.IsAlreadyExists(err), apierrors.IsMethodNotSupported(err):
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	return err
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
	return Network{Namespace: ns, Name: name, UID: u.GetUID()}, nil
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
		return Claim{}, mapErr(err)
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
		Deleting: u.GetDeletionTimestamp() != nil,
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

// DeleteClaim implements API with a UID precondition, and a resourceVersion
// one when resourceVersion is not empty.
func (k *Kube) DeleteClaim(ctx context.Context, ns, name string, uid types.UID, resourceVersion string) error {
	pre := &metav1.Preconditions{UID: &uid}
	if resourceVersion != "" {
		pre.ResourceVersion = &resourceVersion
	}
	return mapErr(k.dyn.Resource(ClaimResource).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{Preconditions: pre}))
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

// Event implements API. Recording is asynchronous and never fails the
// caller: events are for people.
func (k *Kube) Event(_ context.Context, n Network, warning bool, reason, message string) {
	typ := corev1.EventTypeNormal
	if warning {
		typ = corev1.EventTypeWarning
	}
	k.recorder.Event(&corev1.ObjectReference{APIVersion: "networking.datumapis.com/v1alpha", Kind: "Network",
		Namespace: n.Namespace, Name: n.Name, UID: n.UID}, typ, reason, message)
}

// newInformer returns an informer over ri whose cache keeps of each object
// only what trim returns, so that a hub with thousands of objects caches
// little.
func newInformer(ri dynamic.ResourceInterface, what string, trim cache.TransformFunc) (cache.SharedIndexInformer, error) {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return ri.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return ri.Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformerWithOptions(lw, &unstructured.Unstructured{}, cache.SharedIndexInformerOptions{ObjectDescription: what})
	if err := inf.SetTransform(trim); err != nil {
		return nil, fmt.Errorf("%s informer: %w", what, err)
	}
	return inf, nil
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
			return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: u.GetNamespace(), Name: u.GetName(), UID: u.GetUID(), ResourceVersion: u.GetResourceVersion()}}, nil
		}
		return obj, nil
	})
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

// NewClaimInformer returns an informer over the claims in namespace.
func NewClaimInformer(dyn dynamic.Interface, namespace string, on ClaimEvents) (*ClaimInformer, error) {
	inf, err := newInformer(dyn.Resource(ClaimResource).Namespace(namespace), "ipclaims", trimWith(trimClaim))
	if err != nil {
		return nil, err
	}
	bound := func(obj any) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok || !strings.HasPrefix(u.GetName(), ClaimPrefix) {
			return
		}
		// A claim being deleted is still Bound until its finalizer goes;
		// it is no news to its network.
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
// namespace.
func NewAllocationInformer(dyn dynamic.Interface, namespace string) (*AllocationInformer, error) {
	inf, err := newInformer(dyn.Resource(AllocationResource).Namespace(namespace), "ipallocations", trimWith(func(u *unstructured.Unstructured) *unstructured.Unstructured {
		return trimmed(u, []string{"spec", "claimRef", "name"}, []string{"spec", "reclaimPolicy"}, []string{"status", "allocatedCIDR"})
	}))
	if err != nil {
		return nil, err
	}
	return &AllocationInformer{informer: inf, namespace: namespace}, nil
}

// Run runs the informer until ctx ends.
func (a *AllocationInformer) Run(ctx context.Context) { a.informer.RunWithContext(ctx) }

// HasSynced reports whether the initial list has been read.
func (a *AllocationInformer) HasSynced() bool { return a.informer.HasSynced() }

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
			return trimmed(u, []string{"spec", "identity"}, []string{"spec", "networkRef", "name"})
		}))
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

// Get implements IdentityCache.
func (f *FabricIdentityInformer) Get(namespace, name string) (FabricIdentity, bool) {
	u, ok := cached(f.informer, namespace+"/"+name)
	if !ok {
		return FabricIdentity{}, false
	}
	return identityFrom(u), true
}
