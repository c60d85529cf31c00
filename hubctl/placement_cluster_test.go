package hubctl_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/datum-cloud/galactic-node/hubctl"
)

// Placement against a real kube-apiserver: the contexts, policies and
// identities are real objects, written and read through the controller's
// own informers, as the command wires them. Karmada itself does not run:
// its ClusterPropagationPolicy CRD is installed (deploy/crds), and what the
// hub writes is what Karmada would read.

func placeNS(prefix string) string { return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()%1e9) }

// context creates a NetworkContext placing ns/network at location.
func (h *hub) context(t testing.TB, ns, name, network, location string) {
	t.Helper()
	t.Cleanup(func() { h.cluster.Delete(t, hubctl.ContextResource, ns, name) })
	h.cluster.Apply(t, hubctl.ContextResource, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.datumapis.com/v1alpha", "kind": "NetworkContext",
		"metadata": map[string]any{"namespace": ns, "name": name},
		"spec":     map[string]any{"network": map[string]any{"name": network}, "location": map[string]any{"name": location}},
	}})
}

// moveContext points an existing context at another location.
func (h *hub) moveContext(t testing.TB, ns, name, location string) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"location":{"name":%q}}}`, location)
	if _, err := h.dyn.Resource(hubctl.ContextResource).Namespace(ns).Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("move context %s/%s: %v", ns, name, err)
	}
}

// policyOf reads the policy of network ns/name: its locations, or ok false
// when there is none.
func (h *hub) policyOf(t testing.TB, ns, name string) (locations []string, ok bool) {
	t.Helper()
	u, err := h.dyn.Resource(hubctl.PolicyResource).Get(context.Background(), hubctl.PolicyName(ns, name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		t.Fatalf("read policy of %s/%s: %v", ns, name, err)
	}
	return policyLocations(u), true
}

func policyLocations(u *unstructured.Unstructured) []string {
	exprs, _, _ := unstructured.NestedSlice(u.Object, "spec", "placement", "clusterAffinity", "labelSelector", "matchExpressions")
	var out []string
	for _, e := range exprs {
		m := e.(map[string]any)
		if m["key"] == hubctl.LocationTopologyKey && m["operator"] == "In" {
			for _, v := range m["values"].([]any) {
				out = append(out, v.(string))
			}
		}
	}
	return out
}

// identityLocations are the locations the identity's labels record.
func (h *hub) identityLocations(t testing.TB, ns, name string) []string {
	t.Helper()
	u, err := h.dyn.Resource(hubctl.FabricIdentityResource).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	var out []string
	for k, v := range u.GetLabels() {
		if l, ok := strings.CutPrefix(k, hubctl.LabelLocationPrefix); ok && v == "true" {
			out = append(out, l)
		}
	}
	slices.Sort(out)
	return out
}

// placedAt waits until network ns/name's policy and identity labels both
// say locations.
func (h *hub) placedAt(t testing.TB, ns, name string, locations ...string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%s/%s placed at %v", ns, name, locations), func() bool {
		at, ok := h.policyOf(t, ns, name)
		return ok && slices.Equal(at, locations) && slices.Equal(h.identityLocations(t, ns, name), locations)
	})
}

// putPolicy writes a ClusterPropagationPolicy as another writer would.
func (h *hub) putPolicy(t testing.TB, name string, labelled bool, selector map[string]any, locations ...string) {
	t.Helper()
	values := []any{}
	for _, l := range locations {
		values = append(values, l)
	}
	meta := map[string]any{"name": name}
	if labelled {
		meta["labels"] = map[string]any{hubctl.LabelPolicy: "true"}
	}
	t.Cleanup(func() { h.cluster.Delete(t, hubctl.PolicyResource, "", name) })
	h.cluster.Apply(t, hubctl.PolicyResource, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "policy.karmada.io/v1alpha1", "kind": "ClusterPropagationPolicy", "metadata": meta,
		"spec": map[string]any{
			"conflictResolution": "Overwrite",
			"resourceSelectors":  []any{selector},
			"placement": map[string]any{"clusterAffinity": map[string]any{"labelSelector": map[string]any{
				"matchExpressions": []any{map[string]any{"key": hubctl.LocationTopologyKey, "operator": "In", "values": values}}}}},
		},
	}})
}

func identitySelector(ns, name string) map[string]any {
	return map[string]any{"apiVersion": "cloud.datumapis.com/v1alpha1", "kind": "NetworkFabricIdentity", "namespace": ns, "name": name}
}

func (h *hub) policyExists(t testing.TB, name string) bool {
	t.Helper()
	_, err := h.dyn.Resource(hubctl.PolicyResource).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("read policy %s: %v", name, err)
	}
	return err == nil
}

// TestAPlacementFollowsItsNetworksContexts: two locations give one policy
// selecting the identity at both; a context moved moves it; the last
// context gone removes the policy and keeps the identity; the network gone
// removes identity, policy and claim.
func TestAPlacementFollowsItsNetworksContexts(t *testing.T) {
	h := newHub(t, 10)
	in := h.start(t, "", "")
	ns := placeNS("place")
	h.network(t, ns, "net")
	h.context(t, ns, "net-dfw", "net", "dfw")
	h.context(t, ns, "net-iad", "net", "iad")
	h.placedAt(t, ns, "net", "dfw", "iad")
	u, err := h.dyn.Resource(hubctl.PolicyResource).Get(context.Background(), hubctl.PolicyName(ns, "net"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sel, _, _ := unstructured.NestedSlice(u.Object, "spec", "resourceSelectors"); len(sel) != 1 ||
		!equalMaps(sel[0].(map[string]any), identitySelector(ns, "net")) {
		t.Fatalf("policy selects %v, want exactly the identity %s/net", sel, ns)
	}
	if res, _, _ := unstructured.NestedString(u.Object, "spec", "conflictResolution"); res != "Overwrite" || u.GetLabels()[hubctl.LabelPolicy] != "true" {
		t.Fatalf("policy conflictResolution %q, labels %v", res, u.GetLabels())
	}

	h.moveContext(t, ns, "net-iad", "lhr")
	h.placedAt(t, ns, "net", "dfw", "lhr")
	if got := testutil.ToFloat64(hubctl.Withdrawals(in.metrics, hubctl.WithdrawalMoved)); got != 1 {
		t.Errorf("withdrawals moved = %v, want 1", got)
	}

	idBefore, _ := h.identity(ns, "net")
	h.cluster.Delete(t, hubctl.ContextResource, ns, "net-dfw")
	h.cluster.Delete(t, hubctl.ContextResource, ns, "net-iad")
	waitFor(t, "the policy removed with the last context", func() bool { _, ok := h.policyOf(t, ns, "net"); return !ok })
	waitFor(t, "the location labels removed", func() bool { return len(h.identityLocations(t, ns, "net")) == 0 })
	if id, ok := h.identity(ns, "net"); !ok || id != idBefore {
		t.Fatalf("identity after the last context went: %d, %v; want %d kept", id, ok, idBefore)
	}

	h.context(t, ns, "net-ord", "net", "ord")
	h.placedAt(t, ns, "net", "ord")
	h.cluster.Delete(t, hubctl.NetworkResource, ns, "net")
	waitFor(t, "identity, policy and claim gone", func() bool {
		_, idOK := h.identity(ns, "net")
		_, polOK := h.policyOf(t, ns, "net")
		_, err := h.dyn.Resource(hubctl.ClaimResource).Namespace(h.ns).Get(context.Background(), hubctl.ClaimName(ns, "net"), metav1.GetOptions{})
		return !idOK && !polOK && apierrors.IsNotFound(err)
	})
	for reason, want := range map[string]float64{hubctl.WithdrawalNoLocation: 1, hubctl.WithdrawalCollected: 1} {
		if got := testutil.ToFloat64(hubctl.Withdrawals(in.metrics, reason)); got != want {
			t.Errorf("withdrawals %s = %v, want %v", reason, got, want)
		}
	}
	// dfw and iad may be written in one apply or two as the contexts
	// reach the cache, and the last two contexts' deletes may be placed
	// one at a time.
	if got := testutil.ToFloat64(hubctl.PlacementsWritten(in.metrics)); got < 3 || got > 5 {
		t.Errorf("placements written = %v, want 3 to 5 (dfw and iad, moved, [lhr], ord)", got)
	}
}

func equalMaps(a, b map[string]any) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// failingReads makes placement's read of the contexts past the cache fail
// while fail is set: a fault the API server cannot be made to produce for
// one read alone.
type failingReads struct {
	hubctl.PlacementAPI
	fail  *atomic.Bool
	reads *atomic.Int64
}

var errContextsRead = errors.New("injected: contexts not readable")

func (f failingReads) NetworkLocations(ctx context.Context, ns, name string) ([]string, error) {
	f.reads.Add(1)
	if f.fail.Load() {
		return nil, errContextsRead
	}
	return f.PlacementAPI.NetworkLocations(ctx, ns, name)
}

// TestAWithdrawalWaitsOnASuccessfulReadOfTheContexts: the cache says a
// location is gone, but the read past it fails: nothing is withdrawn, the
// hold is on the gauge, and the withdrawal follows the first read that
// succeeds.
func TestAWithdrawalWaitsOnASuccessfulReadOfTheContexts(t *testing.T) {
	h := newHub(t, 10)
	var fail atomic.Bool
	var reads atomic.Int64
	in := h.startOpts(t, "", "", startOpts{placementAPI: func(a hubctl.PlacementAPI) hubctl.PlacementAPI {
		return failingReads{PlacementAPI: a, fail: &fail, reads: &reads}
	}})
	ns := placeNS("held")
	h.network(t, ns, "net")
	h.context(t, ns, "net-dfw", "net", "dfw")
	h.context(t, ns, "net-iad", "net", "iad")
	h.placedAt(t, ns, "net", "dfw", "iad")
	if n := reads.Load(); n != 0 {
		t.Errorf("%d reads past the cache to add locations; want none (only a withdrawal reads)", n)
	}

	fail.Store(true)
	h.cluster.Delete(t, hubctl.ContextResource, ns, "net-iad")
	waitFor(t, "the withdrawal held", func() bool { return testutil.ToFloat64(hubctl.WithdrawalsHeld(in.metrics)) == 1 })
	// Retried with backoff, every retry failing: still both.
	start := reads.Load()
	waitFor(t, "two more failed reads", func() bool { return reads.Load() >= start+2 })
	if at, _ := h.policyOf(t, ns, "net"); !slices.Equal(at, []string{"dfw", "iad"}) {
		t.Fatalf("policy at %v after failed reads; want dfw and iad kept", at)
	}
	if got := h.identityLocations(t, ns, "net"); !slices.Equal(got, []string{"dfw", "iad"}) {
		t.Fatalf("identity labels %v after failed reads; want both kept", got)
	}
	// A location the cache adds meanwhile is placed: a withdrawal held
	// holds nothing else back.
	h.context(t, ns, "net-lhr", "net", "lhr")
	h.placedAt(t, ns, "net", "dfw", "iad", "lhr")
	if !hasEvent(t, h, ns, "net", "FabricIdentityWithdrawalHeld") {
		t.Error("no FabricIdentityWithdrawalHeld event on the network")
	}

	fail.Store(false)
	h.placedAt(t, ns, "net", "dfw", "lhr")
	waitFor(t, "the hold cleared", func() bool { return testutil.ToFloat64(hubctl.WithdrawalsHeld(in.metrics)) == 0 })
}

func hasEvent(t testing.TB, h *hub, ns, name, reason string) bool {
	t.Helper()
	found := false
	waitForOr(func() bool {
		events, err := h.cs.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range events.Items {
			found = found || (e.Reason == reason && e.InvolvedObject.Name == name)
		}
		return found
	}, 10*time.Second)
	return found
}

func waitForOr(cond func() bool, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for !cond() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
}

// TestANetworkBeingDeletedKeepsItsPlacement: a network held by a
// finalizer, its contexts gone, keeps its identity and policy until it is
// gone: its teardown needs them.
func TestANetworkBeingDeletedKeepsItsPlacement(t *testing.T) {
	h := newHub(t, 10)
	in := h.start(t, "", "")
	ns := placeNS("going")
	h.cluster.Apply(t, hubctl.NetworkResource, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.datumapis.com/v1alpha", "kind": "Network",
		"metadata": map[string]any{"namespace": ns, "name": "net", "finalizers": []any{"test.galactic/teardown"}}, "spec": map[string]any{},
	}})
	unhold := func() {
		_, _ = h.dyn.Resource(hubctl.NetworkResource).Namespace(ns).Patch(context.Background(), "net", types.MergePatchType,
			[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	}
	t.Cleanup(unhold)
	h.context(t, ns, "net-dfw", "net", "dfw")
	h.placedAt(t, ns, "net", "dfw")

	if err := h.dyn.Resource(hubctl.NetworkResource).Namespace(ns).Delete(context.Background(), "net", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the network's deletionTimestamp in the hub's cache", func() bool { return in.networks.Deleting(ns, "net") })
	h.cluster.Delete(t, hubctl.ContextResource, ns, "net-dfw")
	waitFor(t, "the context's delete in the hub's cache", func() bool { return len(in.placement.Locations(ns, "net")) == 0 })
	// The context's delete woke the network; give its reconcile time.
	in.ctl.ContextChanged(ns, "net")
	time.Sleep(time.Second)
	if at, ok := h.policyOf(t, ns, "net"); !ok || !slices.Equal(at, []string{"dfw"}) {
		t.Fatalf("policy of a network being deleted: %v, %v; want it kept at dfw", at, ok)
	}
	if _, ok := h.identity(ns, "net"); !ok {
		t.Fatal("identity of a network being deleted is gone")
	}

	unhold()
	waitFor(t, "identity and policy gone with the network", func() bool {
		_, idOK := h.identity(ns, "net")
		_, polOK := h.policyOf(t, ns, "net")
		return !idOK && !polOK
	})
}

// unseenDeletion is a network cache that has not seen any network's
// deletionTimestamp: the informer of networks lagging the informer of
// contexts, an order of events the API server does not promise and a test
// cannot make it produce.
type unseenDeletion struct{ hubctl.PlacementCache }

func (unseenDeletion) Deleting(string, string) bool { return false }

// networkReads counts placement's reads of networks past the cache, once
// each has been answered.
type networkReads struct {
	hubctl.PlacementAPI
	n *atomic.Int64
}

func (r networkReads) GetNetwork(ctx context.Context, ns, name string) (hubctl.Network, error) {
	defer r.n.Add(1)
	return r.PlacementAPI.GetNetwork(ctx, ns, name)
}

// TestANetworkBeingDeletedKeepsItsPlacementWhenTheCacheHasNotSeenIt: the
// contexts' deletes reach the hub before the network's deletionTimestamp
// does; the read past the cache that a withdrawal waits on reads the
// network too, and finds it being deleted.
func TestANetworkBeingDeletedKeepsItsPlacementWhenTheCacheHasNotSeenIt(t *testing.T) {
	h := newHub(t, 10)
	var reads atomic.Int64
	in := h.startOpts(t, "", "", startOpts{
		placementCache: func(c hubctl.PlacementCache) hubctl.PlacementCache { return unseenDeletion{c} },
		placementAPI:   func(a hubctl.PlacementAPI) hubctl.PlacementAPI { return networkReads{a, &reads} },
	})
	ns := placeNS("unseen")
	h.cluster.Apply(t, hubctl.NetworkResource, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.datumapis.com/v1alpha", "kind": "Network",
		"metadata": map[string]any{"namespace": ns, "name": "net", "finalizers": []any{"test.galactic/teardown"}}, "spec": map[string]any{},
	}})
	t.Cleanup(func() {
		_, _ = h.dyn.Resource(hubctl.NetworkResource).Namespace(ns).Patch(context.Background(), "net", types.MergePatchType,
			[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	})
	h.context(t, ns, "net-dfw", "net", "dfw")
	h.placedAt(t, ns, "net", "dfw")
	if err := h.dyn.Resource(hubctl.NetworkResource).Namespace(ns).Delete(context.Background(), "net", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.cluster.Delete(t, hubctl.ContextResource, ns, "net-dfw")
	waitFor(t, "the context's delete in the hub's cache", func() bool { return len(in.placement.Locations(ns, "net")) == 0 })
	waitFor(t, "the withdrawal's read of the network", func() bool { return reads.Load() > 0 })
	time.Sleep(200 * time.Millisecond) // what the reconcile does next, if anything
	if at, ok := h.policyOf(t, ns, "net"); !ok || !slices.Equal(at, []string{"dfw"}) {
		t.Fatalf("policy of a network being deleted, unseen by the cache: %v, %v; want it kept at dfw", at, ok)
	}
}

// TestTheSweepRemovesWhatAGoneNetworksPolicyLeftAndNothingElse: at start,
// a labelled policy whose network is gone (a hub killed between the
// identity's delete and the unplace) is removed, an older per-location
// policy is removed, a live network's policy is kept, and a policy without
// the label is never touched, even one shaped and named as a gone
// network's.
func TestTheSweepRemovesWhatAGoneNetworksPolicyLeftAndNothingElse(t *testing.T) {
	h := newHub(t, 10)
	ns := placeNS("sweep")
	left := hubctl.PolicyName(ns, "gone")
	h.putPolicy(t, left, true, identitySelector(ns, "gone"), "dfw")
	legacy := "cloud-fabric-identity-" + ns + "-dfw"
	h.putPolicy(t, legacy, true, map[string]any{"apiVersion": "cloud.datumapis.com/v1alpha1", "kind": "NetworkFabricIdentity",
		"labelSelector": map[string]any{"matchLabels": map[string]any{hubctl.LocationLabel("dfw"): "true"}}}, "dfw")
	foreign := hubctl.PolicyName(ns, "also-gone")
	h.putPolicy(t, foreign, false, identitySelector(ns, "also-gone"), "dfw")
	h.network(t, ns, "live")
	livePolicy := hubctl.PolicyName(ns, "live")
	h.putPolicy(t, livePolicy, true, identitySelector(ns, "live"), "iad")

	in := h.startOpts(t, "", "", startOpts{manual: true})
	in.ctl.Sweep(in.ctx)
	if h.policyExists(t, left) {
		t.Error("the gone network's policy survived the sweep")
	}
	if h.policyExists(t, legacy) {
		t.Error("the older per-location policy survived the sweep")
	}
	if !h.policyExists(t, foreign) {
		t.Error("the sweep deleted a policy without the label")
	}
	if !h.policyExists(t, livePolicy) {
		t.Error("the sweep deleted a live network's policy")
	}
	// At least: the API server is shared with the package's other tests,
	// whose policies are cluster-scoped too.
	for result, want := range map[string]float64{hubctl.SweepPolicyRemoved: 1, hubctl.SweepPolicyLegacyRemoved: 1, "live": 1} {
		if got := testutil.ToFloat64(hubctl.SweepPolicies(in.metrics, result)); got < want {
			t.Errorf("sweep policies %s = %v, want at least %v", result, got, want)
		}
	}
	// And the unlabelled one stays for good: the workers leave it too.
	in.run()
	time.Sleep(500 * time.Millisecond)
	if !h.policyExists(t, foreign) {
		t.Error("a policy without the label was deleted after the sweep")
	}
}

// TestAPolicyNameTwoNetworksShareIsNeverTakenFromTheOther: a-b/c and
// a/b-c both name their policy cloud-fabric-identity-a-b-c. The first to be
// placed holds it; the other is refused, named, and never overwrites or
// deletes it, not even when it is collected.
func TestAPolicyNameTwoNetworksShareIsNeverTakenFromTheOther(t *testing.T) {
	h := newHub(t, 10)
	in := h.start(t, "", "")
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	first, second := hubctl.Key{Namespace: "p-" + suffix + "-x", Name: "net"}, hubctl.Key{Namespace: "p-" + suffix, Name: "x-net"}
	if hubctl.PolicyName(first.Namespace, first.Name) != hubctl.PolicyName(second.Namespace, second.Name) {
		t.Fatal("the two networks do not share a policy name")
	}
	h.network(t, first.Namespace, first.Name)
	h.context(t, first.Namespace, "ctx", first.Name, "dfw")
	h.placedAt(t, first.Namespace, first.Name, "dfw")

	held, err := h.dyn.Resource(hubctl.PolicyResource).Get(context.Background(), hubctl.PolicyName(first.Namespace, first.Name), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h.network(t, second.Namespace, second.Name)
	h.context(t, second.Namespace, "ctx", second.Name, "iad")
	waitFor(t, "the second network refused", func() bool {
		return testutil.ToFloat64(hubctl.PlacementRefusals(in.metrics, hubctl.CausePolicyTaken)) >= 1
	})
	if !hasEvent(t, h, second.Namespace, second.Name, "FabricIdentityPlacementRefused") {
		t.Error("no FabricIdentityPlacementRefused event on the refused network")
	}
	h.cluster.Delete(t, hubctl.NetworkResource, second.Namespace, second.Name)
	waitFor(t, "the refused network collected", func() bool { _, ok := h.identity(second.Namespace, second.Name); return !ok })
	time.Sleep(300 * time.Millisecond)
	u, err := h.dyn.Resource(hubctl.PolicyResource).Get(context.Background(), hubctl.PolicyName(first.Namespace, first.Name), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the first network's policy: %v; want it untouched", err)
	}
	// Deleted and written again (the first network lives, so it is
	// placed again) is not untouched: its location was cut off meanwhile.
	if u.GetUID() != held.GetUID() {
		t.Fatal("the first network's policy was deleted when the second network was collected")
	}
	sel, _, _ := unstructured.NestedSlice(u.Object, "spec", "resourceSelectors")
	if len(sel) != 1 || !equalMaps(sel[0].(map[string]any), identitySelector(first.Namespace, first.Name)) || !slices.Equal(policyLocations(u), []string{"dfw"}) {
		t.Fatalf("the first network's policy was changed: selects %v at %v", sel, policyLocations(u))
	}
}

// TestAPolicyChangedBySomeoneElseIsMended: a live network's policy edited
// or deleted by hand is written back to its contexts' locations.
func TestAPolicyChangedBySomeoneElseIsMended(t *testing.T) {
	h := newHub(t, 10)
	h.start(t, "", "")
	ns := placeNS("mend")
	h.network(t, ns, "net")
	h.context(t, ns, "net-dfw", "net", "dfw")
	h.placedAt(t, ns, "net", "dfw")
	patch := fmt.Sprintf(`{"spec":{"placement":{"clusterAffinity":{"labelSelector":{"matchExpressions":[{"key":%q,"operator":"In","values":["dfw","sin"]}]}}}}}`,
		hubctl.LocationTopologyKey)
	if _, err := h.dyn.Resource(hubctl.PolicyResource).Patch(context.Background(), hubctl.PolicyName(ns, "net"), types.MergePatchType,
		[]byte(patch), metav1.PatchOptions{FieldManager: "someone-else"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the edit seen", func() bool { at, _ := h.policyOf(t, ns, "net"); return len(at) == 1 || slices.Contains(at, "sin") })
	h.placedAt(t, ns, "net", "dfw")
	h.cluster.Delete(t, hubctl.PolicyResource, "", hubctl.PolicyName(ns, "net"))
	h.placedAt(t, ns, "net", "dfw")
}

// TestAPolicyWithoutTheLabelIsNeverTouched: a policy without the label
// that holds a live network's policy name, even selecting its identity, is
// neither overwritten nor labelled while the network lives, nor deleted
// when it goes; the network's placement is refused and named instead.
func TestAPolicyWithoutTheLabelIsNeverTouched(t *testing.T) {
	h := newHub(t, 10)
	in := h.start(t, "", "")
	ns := placeNS("foreign")
	name := hubctl.PolicyName(ns, "net")
	h.putPolicy(t, name, false, identitySelector(ns, "net"), "sin")
	before, err := h.dyn.Resource(hubctl.PolicyResource).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h.network(t, ns, "net")
	h.context(t, ns, "net-dfw", "net", "dfw")
	waitFor(t, "the placement refused", func() bool {
		return testutil.ToFloat64(hubctl.PlacementRefusals(in.metrics, hubctl.CausePolicyTaken)) >= 1
	})
	if !hasEvent(t, h, ns, "net", "FabricIdentityPlacementRefused") {
		t.Error("no FabricIdentityPlacementRefused event on the network")
	}
	// Retried every MaxDelay (1 s here), named once.
	time.Sleep(2500 * time.Millisecond)
	if got := testutil.ToFloat64(hubctl.PlacementRefusals(in.metrics, hubctl.CausePolicyTaken)); got != 1 {
		t.Errorf("policy_taken counted %v times for one network, want once", got)
	}
	if got := testutil.ToFloat64(hubctl.PlacementsRefused(in.metrics)); got != 1 {
		t.Errorf("placements refused now = %v, want 1", got)
	}
	h.cluster.Delete(t, hubctl.NetworkResource, ns, "net")
	waitFor(t, "the network collected", func() bool { _, ok := h.identity(ns, "net"); return !ok })
	waitFor(t, "the refusal forgotten with the network", func() bool { return testutil.ToFloat64(hubctl.PlacementsRefused(in.metrics)) == 0 })
	time.Sleep(300 * time.Millisecond)
	after, err := h.dyn.Resource(hubctl.PolicyResource).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the policy without the label: %v; want it untouched", err)
	}
	if after.GetResourceVersion() != before.GetResourceVersion() {
		t.Fatalf("the policy without the label was written: labels %v, locations %v", after.GetLabels(), policyLocations(after))
	}
}

// TestALongNetworkNameIsPlacedUnderAHashedPolicyName: a network whose
// policy name would pass 253 characters is placed under the hashed name
// and unplaced with it.
func TestALongNetworkNameIsPlacedUnderAHashedPolicyName(t *testing.T) {
	h := newHub(t, 10)
	h.start(t, "", "")
	ns, name := placeNS("long"), strings.Repeat("n", 240)
	policy := hubctl.PolicyName(ns, name)
	if strings.Contains(policy, name) {
		t.Fatalf("policy name %q is not hashed", policy)
	}
	h.network(t, ns, name)
	h.context(t, ns, "ctx", name, "dfw")
	h.placedAt(t, ns, name, "dfw")
	h.cluster.Delete(t, hubctl.NetworkResource, ns, name)
	waitFor(t, "the hashed policy removed", func() bool { return !h.policyExists(t, policy) })
}

// stalePolicy is a policy cache that still shows one policy as it was
// read once: the policy informer lagging a delete and a re-create, which
// a test cannot make a real watch do on cue.
type stalePolicy struct {
	hubctl.PlacementCache
	stale *atomic.Pointer[hubctl.PlacementPolicy]
}

func (s stalePolicy) Policy(name string) (hubctl.PlacementPolicy, bool) {
	if p := s.stale.Load(); p != nil && p.Name == name {
		return *p, true
	}
	return s.PlacementCache.Policy(name)
}

// TestAnApplyOverAStaleReadOfThePolicyWritesNothing: the policy the cache
// shows as this network's was deleted and its name taken by another
// network's; the apply carries the version read, so it is refused and the
// other network's policy stays as it is.
func TestAnApplyOverAStaleReadOfThePolicyWritesNothing(t *testing.T) {
	h := newHub(t, 10)
	var stale atomic.Pointer[hubctl.PlacementPolicy]
	in := h.startOpts(t, "", "", startOpts{placementCache: func(c hubctl.PlacementCache) hubctl.PlacementCache {
		return stalePolicy{c, &stale}
	}})
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	ours, other := hubctl.Key{Namespace: "s-" + suffix + "-x", Name: "net"}, hubctl.Key{Namespace: "s-" + suffix, Name: "x-net"}
	name := hubctl.PolicyName(ours.Namespace, ours.Name)
	h.network(t, ours.Namespace, ours.Name)
	h.context(t, ours.Namespace, "dfw", ours.Name, "dfw")
	h.placedAt(t, ours.Namespace, ours.Name, "dfw")
	read, ok := in.placement.Policy(name)
	if !ok {
		t.Fatal("the placed policy is not cached")
	}
	stale.Store(&read)
	h.cluster.Delete(t, hubctl.PolicyResource, "", name)
	h.putPolicy(t, name, true, identitySelector(other.Namespace, other.Name), "sin")
	theirs, err := h.dyn.Resource(hubctl.PolicyResource).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h.context(t, ours.Namespace, "iad", ours.Name, "iad")
	waitFor(t, "iad in the hub's context cache", func() bool { return len(in.placement.Locations(ours.Namespace, ours.Name)) == 2 })
	in.ctl.ContextChanged(ours.Namespace, ours.Name)
	time.Sleep(time.Second)
	got, err := h.dyn.Resource(hubctl.PolicyResource).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetResourceVersion() != theirs.GetResourceVersion() {
		sel, _, _ := unstructured.NestedSlice(got.Object, "spec", "resourceSelectors")
		t.Fatalf("the other network's policy was written over a stale read: selects %v at %v", sel, policyLocations(got))
	}
}

// TestAPolicyBeingDeletedIsReportedGone: Karmada's webhook puts its
// finalizer on every policy, so a deleted one lingers with a
// deletionTimestamp. The informer reports that update as the policy gone,
// not as a policy written: otherwise every collect would queue its gone
// network to be collected again.
func TestAPolicyBeingDeletedIsReportedGone(t *testing.T) {
	h := newHub(t, 10)
	rc, cs := h.clients(t)
	kube := hubctl.NewKube(rc, cs, h.ns, "galactic-hubctl-test")
	t.Cleanup(kube.Shutdown)
	networks, err := hubctl.NewNetworkInformer(kube.Dynamic(), func(string, string) {})
	if err != nil {
		t.Fatal(err)
	}
	identities, err := hubctl.NewFabricIdentityInformer(kube.Dynamic(), func(string, string) {})
	if err != nil {
		t.Fatal(err)
	}
	ns := placeNS("finalized")
	var mu sync.Mutex
	var seen []bool
	infs, err := hubctl.NewPlacementInformers(kube.Dynamic(), networks, identities, hubctl.PlacementEvents{
		Context: func(string, string) {},
		Policy: func(pns, name string, present bool) {
			if pns == ns && name == "net" {
				mu.Lock()
				seen = append(seen, present)
				mu.Unlock()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go infs.Run(ctx)
	waitFor(t, "the placement informers synced", infs.HasSynced)
	events := func() []bool { mu.Lock(); defer mu.Unlock(); return slices.Clone(seen) }

	name := hubctl.PolicyName(ns, "net")
	h.putPolicy(t, name, true, identitySelector(ns, "net"), "dfw")
	if _, err := h.dyn.Resource(hubctl.PolicyResource).Patch(context.Background(), name, types.MergePatchType,
		[]byte(`{"metadata":{"finalizers":["karmada.io/cluster-propagation-policy-controller"]}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = h.dyn.Resource(hubctl.PolicyResource).Patch(context.Background(), name, types.MergePatchType,
			[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	})
	waitFor(t, "the policy and its finalizer reported", func() bool { return len(events()) >= 2 })
	written := len(events())
	h.cluster.Delete(t, hubctl.PolicyResource, "", name)
	waitFor(t, "the policy being deleted in the cache", func() bool { p, ok := infs.Policy(name); return ok && p.Deleting })
	waitFor(t, "its deletionTimestamp reported", func() bool { return len(events()) > written })
	for i, present := range events()[written:] {
		if present {
			t.Fatalf("event %d after the delete reports the policy present: a lingering policy would be collected for again", written+i)
		}
	}
}
