package hubctl

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
)

// Resources placement reads and writes.
var (
	ContextResource = schema.GroupVersionResource{Group: "networking.datumapis.com", Version: "v1alpha", Resource: "networkcontexts"}
	PolicyResource  = schema.GroupVersionResource{Group: "policy.karmada.io", Version: "v1alpha1", Resource: "clusterpropagationpolicies"}
)

// NetworkLocations implements PlacementAPI: one LIST of the namespace's
// contexts, filtered by network here, as the fabric identity controller
// reads them (the CRD declares no selectable field for spec.network.name).
func (k *Kube) NetworkLocations(ctx context.Context, ns, name string) ([]string, error) {
	list, err := k.dyn.Resource(ContextResource).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list network contexts in %s: %w", ns, mapErr(err))
	}
	var out []string
	for i := range list.Items {
		network, location := contextOf(&list.Items[i])
		if network == name && location != "" {
			out = append(out, location)
		}
	}
	return normalize(out), nil
}

// contextOf reads a NetworkContext's network and location.
func contextOf(u *unstructured.Unstructured) (network, location string) {
	network, _, _ = unstructured.NestedString(u.Object, "spec", "network", "name")
	location, _, _ = unstructured.NestedString(u.Object, "spec", "location", "name")
	return network, location
}

// policyObject is the ClusterPropagationPolicy that places network key's
// identity at locations, in the fabric identity controller's shape.
func policyObject(key Key, locations []string) map[string]any {
	values := make([]any, 0, len(locations))
	for _, l := range locations {
		values = append(values, l)
	}
	return map[string]any{
		"apiVersion": PolicyResource.GroupVersion().String(), "kind": "ClusterPropagationPolicy",
		"metadata": map[string]any{"name": PolicyName(key.Namespace, key.Name), "labels": map[string]any{LabelPolicy: "true"}},
		"spec": map[string]any{
			"conflictResolution": "Overwrite",
			"resourceSelectors": []any{map[string]any{
				"apiVersion": FabricIdentityResource.GroupVersion().String(), "kind": "NetworkFabricIdentity",
				"namespace": key.Namespace, "name": key.Name,
			}},
			"placement": map[string]any{"clusterAffinity": map[string]any{"labelSelector": map[string]any{
				"matchExpressions": []any{map[string]any{"key": LocationTopologyKey, "operator": "In", "values": values}},
			}}},
		},
	}
}

// CreatePolicy implements PlacementAPI.
func (k *Kube) CreatePolicy(ctx context.Context, key Key, locations []string) error {
	name := PolicyName(key.Namespace, key.Name)
	_, err := k.dyn.Resource(PolicyResource).Create(ctx, &unstructured.Unstructured{Object: policyObject(key, locations)},
		metav1.CreateOptions{FieldManager: PlacementFieldManager})
	if apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create policy %s: %w: %w", name, ErrExists, err)
	}
	if err != nil {
		return fmt.Errorf("create policy %s: %w", name, mapErr(err))
	}
	return nil
}

// ApplyPolicy implements PlacementAPI: the resourceVersion in the applied
// object is a precondition (409 Conflict when the object changed since).
func (k *Kube) ApplyPolicy(ctx context.Context, key Key, locations []string, resourceVersion string) error {
	obj := policyObject(key, locations)
	obj["metadata"].(map[string]any)["resourceVersion"] = resourceVersion
	body, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	name := PolicyName(key.Namespace, key.Name)
	force := true
	_, err = k.dyn.Resource(PolicyResource).Patch(ctx, name, types.ApplyPatchType, body,
		metav1.PatchOptions{FieldManager: PlacementFieldManager, Force: &force})
	if err != nil {
		return fmt.Errorf("apply policy %s: %w", name, mapErr(err))
	}
	return nil
}

// DeletePolicy implements PlacementAPI.
func (k *Kube) DeletePolicy(ctx context.Context, name string, uid types.UID) error {
	err := k.dyn.Resource(PolicyResource).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil {
		return fmt.Errorf("delete policy %s: %w", name, mapErr(err))
	}
	return nil
}

// SetIdentityLocations implements PlacementAPI: one merge patch of the
// identity's labels, which adds and drops exactly the labels named and
// leaves every other label as it is.
func (k *Kube) SetIdentityLocations(ctx context.Context, key Key, add, drop []string) error {
	labels := map[string]any{}
	for _, l := range add {
		labels[LocationLabel(l)] = "true"
	}
	for _, l := range drop {
		labels[LocationLabel(l)] = nil
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if err != nil {
		return err
	}
	_, err = k.dyn.Resource(FabricIdentityResource).Namespace(key.Namespace).Patch(ctx, key.Name, types.MergePatchType, body,
		metav1.PatchOptions{FieldManager: PlacementFieldManager})
	if err != nil {
		return fmt.Errorf("label fabric identity %s: %w", key, mapErr(err))
	}
	return nil
}

// policyFrom reads a ClusterPropagationPolicy.
func policyFrom(u *unstructured.Unstructured) PlacementPolicy {
	p := PlacementPolicy{Name: u.GetName(), UID: u.GetUID(), ResourceVersion: u.GetResourceVersion(),
		Labelled: u.GetLabels()[LabelPolicy] == "true", Deleting: u.GetDeletionTimestamp() != nil, Named: true}
	res, _, _ := unstructured.NestedFieldNoCopy(u.Object, "spec", "conflictResolution")
	p.Overwrite = res == "Overwrite"
	selectors, _, _ := unstructured.NestedSlice(u.Object, "spec", "resourceSelectors")
	for _, s := range selectors {
		m, _ := s.(map[string]any)
		if name, _ := m["name"].(string); name == "" {
			p.Named = false
		}
	}
	if len(selectors) == 1 {
		m, _ := selectors[0].(map[string]any)
		apiVersion, _ := m["apiVersion"].(string)
		kind, _ := m["kind"].(string)
		ns, _ := m["namespace"].(string)
		name, _ := m["name"].(string)
		if apiVersion == FabricIdentityResource.GroupVersion().String() && kind == "NetworkFabricIdentity" && ns != "" && name != "" {
			p.Identity, p.Selects = Key{ns, name}, true
		}
	}
	exprs, _, _ := unstructured.NestedSlice(u.Object, "spec", "placement", "clusterAffinity", "labelSelector", "matchExpressions")
	for _, e := range exprs {
		m, _ := e.(map[string]any)
		if m["key"] != LocationTopologyKey || m["operator"] != "In" {
			continue
		}
		values, _ := m["values"].([]any)
		for _, v := range values {
			if s, ok := v.(string); ok {
				p.Locations = append(p.Locations, s)
			}
		}
	}
	p.Locations = normalize(p.Locations)
	return p
}

// listWatcher is what an informer needs of a resource.
type listWatcher interface {
	List(ctx context.Context, o metav1.ListOptions) (*unstructured.UnstructuredList, error)
	Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error)
}

// labelSelected lists and watches only the objects with a label.
type labelSelected struct {
	dynamic.ResourceInterface
	selector string
}

func (l labelSelected) List(ctx context.Context, o metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	o.LabelSelector = l.selector
	return l.ResourceInterface.List(ctx, o)
}

func (l labelSelected) Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	o.LabelSelector = l.selector
	return l.ResourceInterface.Watch(ctx, o)
}

// networkIndex indexes contexts by the network they place.
const networkIndex = "network"

// PlacementInformers cache what placement decides on: the contexts of
// every namespace (their network and location), the labelled policies, and,
// through the network and identity informers, which networks are being
// deleted and where identities are recorded as placed. It is the Placer's
// PlacementCache.
type PlacementInformers struct {
	contexts   cache.SharedIndexInformer
	policies   cache.SharedIndexInformer
	networks   *NetworkInformer
	identities *FabricIdentityInformer
}

// PlacementEvents are what PlacementInformers report.
type PlacementEvents struct {
	// Context is called with the network of every context added, changed
	// or deleted (both networks when a context changes network).
	Context func(namespace, name string)
	// Policy is called with the network whose identity a policy selects,
	// when the policy is added or changed (present) or deleted.
	Policy func(namespace, name string, present bool)
}

// NewPlacementInformers returns the informers over contexts and labelled
// policies, reading networks and identities from their informers.
func NewPlacementInformers(dyn dynamic.Interface, networks *NetworkInformer, identities *FabricIdentityInformer, on PlacementEvents) (*PlacementInformers, error) {
	contexts, err := newInformer(dyn.Resource(ContextResource).Namespace(metav1.NamespaceAll), "networkcontexts",
		trimWith(func(u *unstructured.Unstructured) *unstructured.Unstructured {
			return trimmed(u, []string{"spec", "network", "name"}, []string{"spec", "location", "name"})
		}), 0)
	if err != nil {
		return nil, err
	}
	if err := contexts.AddIndexers(cache.Indexers{networkIndex: func(obj any) ([]string, error) {
		if k, ok := networkOfContext(obj); ok {
			return []string{k.String()}, nil
		}
		return nil, nil
	}}); err != nil {
		return nil, fmt.Errorf("network context informer: %w", err)
	}
	onContext := func(obj any) {
		if k, ok := networkOfContext(obj); ok {
			on.Context(k.Namespace, k.Name)
		}
	}
	if _, err := contexts.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onContext, DeleteFunc: onContext,
		UpdateFunc: func(old, n any) {
			onContext(n)
			// A context moved to another network leaves the old one too.
			if was, ok := networkOfContext(old); ok {
				if now, _ := networkOfContext(n); now != was {
					on.Context(was.Namespace, was.Name)
				}
			}
		},
	}); err != nil {
		return nil, fmt.Errorf("network context informer: %w", err)
	}
	policies, err := newInformer(labelSelected{dyn.Resource(PolicyResource), LabelPolicy + "=true"}, "clusterpropagationpolicies",
		trimWith(func(u *unstructured.Unstructured) *unstructured.Unstructured {
			t := trimmed(u, []string{"spec", "resourceSelectors"}, []string{"spec", "conflictResolution"},
				[]string{"spec", "placement", "clusterAffinity", "labelSelector", "matchExpressions"})
			t.SetLabels(map[string]string{LabelPolicy: u.GetLabels()[LabelPolicy]})
			return t
		}), 0)
	if err != nil {
		return nil, err
	}
	onPolicy := func(present bool) func(any) {
		return func(obj any) {
			if u, ok := unwrap(obj); ok {
				// One being deleted (Karmada's finalizer holds every policy
				// its webhook admitted) is as good as gone: its
				// deletionTimestamp is not a new policy to collect for.
				if p := policyFrom(u); p.Selects {
					on.Policy(p.Identity.Namespace, p.Identity.Name, present && !p.Deleting)
				}
			}
		}
	}
	if _, err := policies.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onPolicy(true), UpdateFunc: func(_, n any) { onPolicy(true)(n) }, DeleteFunc: onPolicy(false),
	}); err != nil {
		return nil, fmt.Errorf("policy informer: %w", err)
	}
	return &PlacementInformers{contexts: contexts, policies: policies, networks: networks, identities: identities}, nil
}

// networkOfContext is the network a context (an informer's object or
// tombstone) places.
func networkOfContext(obj any) (Key, bool) {
	u, ok := unwrap(obj)
	if !ok {
		return Key{}, false
	}
	network, _ := contextOf(u)
	return Key{u.GetNamespace(), network}, true
}

// unwrap is the object of an informer event, a tombstone's too.
func unwrap(obj any) (*unstructured.Unstructured, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	return u, ok
}

// Run runs the informers until ctx ends.
func (p *PlacementInformers) Run(ctx context.Context) {
	go p.contexts.RunWithContext(ctx)
	p.policies.RunWithContext(ctx)
}

// HasSynced reports whether both initial lists have been read.
func (p *PlacementInformers) HasSynced() bool {
	return p.contexts.HasSynced() && p.policies.HasSynced()
}

// Locations implements PlacementCache.
func (p *PlacementInformers) Locations(namespace, name string) []string {
	objs, err := p.contexts.GetIndexer().ByIndex(networkIndex, namespace+"/"+name)
	if err != nil {
		return nil
	}
	var out []string
	for _, obj := range objs {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			if _, location := contextOf(u); location != "" {
				out = append(out, location)
			}
		}
	}
	return normalize(out)
}

// Policy implements PlacementCache.
func (p *PlacementInformers) Policy(name string) (PlacementPolicy, bool) {
	u, ok := cached(p.policies, name)
	if !ok {
		return PlacementPolicy{}, false
	}
	return policyFrom(u), true
}

// Policies implements PlacementCache.
func (p *PlacementInformers) Policies() []PlacementPolicy {
	var out []PlacementPolicy
	for _, obj := range p.policies.GetStore().List() {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			out = append(out, policyFrom(u))
		}
	}
	return out
}

// IdentityLocations implements PlacementCache.
func (p *PlacementInformers) IdentityLocations(namespace, name string) []string {
	u, ok := cached(p.identities.informer, namespace+"/"+name)
	if !ok {
		return nil
	}
	var out []string
	for k, v := range u.GetLabels() {
		if l, ok := strings.CutPrefix(k, LabelLocationPrefix); ok && v == "true" {
			out = append(out, l)
		}
	}
	return normalize(out)
}

// Deleting implements PlacementCache.
func (p *PlacementInformers) Deleting(namespace, name string) bool {
	return p.networks.Deleting(namespace, name)
}

// UID implements PlacementCache.
func (p *PlacementInformers) UID(namespace, name string) (types.UID, bool) {
	return p.networks.UID(namespace, name)
}
