package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/datum-cloud/galactic-node/hubctl"
	"github.com/datum-cloud/galactic-node/test/framework/ipamtest"
)

// The built galactic-hubctl placing fabric identities with Karmada
// ClusterPropagationPolicies (docs/hub.md, "Placement"), against a real
// kube-apiserver behind the ipam-shaped address service, whose Intercept
// seam injects the faults and holds a real API server cannot be made to
// produce on one resource alone.

type placeScene struct {
	*ipamScene
	team string
}

func newPlaceScene(t *testing.T) *placeScene {
	t.Helper()
	s := &placeScene{ipamScene: newIpamScene(t, ipamtest.Options{}), team: fmt.Sprintf("place-%d", time.Now().UnixNano()%1e9)}
	if _, err := s.cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.team}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *placeScene) awaitReady(hub *hubProc) {
	s.t.Helper()
	s.await("/readyz 200", time.Minute, func() bool { code, _ := hub.get("/readyz"); return code == http.StatusOK })
}

// context creates NetworkContext ns/name placing network at location.
func (s *placeScene) context(name, network, location string) {
	s.t.Helper()
	_, err := s.dyn.Resource(hubctl.ContextResource).Namespace(s.team).Create(context.Background(), &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.datumapis.com/v1alpha", "kind": "NetworkContext",
		"metadata": map[string]any{"namespace": s.team, "name": name},
		"spec":     map[string]any{"network": map[string]any{"name": network}, "location": map[string]any{"name": location}},
	}}, metav1.CreateOptions{})
	if err != nil {
		s.t.Fatalf("create context %s/%s: %v", s.team, name, err)
	}
}

// moveContext sets context name's location.
func (s *placeScene) moveContext(name, location string) {
	s.t.Helper()
	ri := s.dyn.Resource(hubctl.ContextResource).Namespace(s.team)
	body := fmt.Sprintf(`{"spec":{"location":{"name":%q}}}`, location)
	if _, err := ri.Patch(context.Background(), name, types.MergePatchType, []byte(body), metav1.PatchOptions{}); err != nil {
		s.t.Fatalf("move context %s/%s to %s: %v", s.team, name, location, err)
	}
}

// deleteContext deletes context name and waits until it is gone.
func (s *placeScene) deleteContext(name string) {
	s.t.Helper()
	s.cluster.Delete(s.t, hubctl.ContextResource, s.team, name)
	s.await("context "+name+" gone", 30*time.Second, func() bool {
		_, err := s.dyn.Resource(hubctl.ContextResource).Namespace(s.team).Get(context.Background(), name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

// placed is a ClusterPropagationPolicy as the test reads it.
type placed struct {
	found, labelled, overwrite bool
	// selects is "namespace/name" of the one NetworkFabricIdentity its one
	// selector names, "" otherwise.
	selects   string
	locations []string
	obj       *unstructured.Unstructured
}

func (p placed) String() string {
	if !p.found {
		return "no policy"
	}
	return fmt.Sprintf("policy %s (labelled %v, overwrite %v, selects %q, locations %v)", p.obj.GetName(), p.labelled, p.overwrite, p.selects, p.locations)
}

func readPolicy(u *unstructured.Unstructured) placed {
	p := placed{found: true, obj: u, labelled: u.GetLabels()[hubctl.LabelPolicy] == "true"}
	res, _, _ := unstructured.NestedString(u.Object, "spec", "conflictResolution")
	p.overwrite = res == "Overwrite"
	selectors, _, _ := unstructured.NestedSlice(u.Object, "spec", "resourceSelectors")
	if len(selectors) == 1 {
		m, _ := selectors[0].(map[string]any)
		if m["apiVersion"] == "cloud.datumapis.com/v1alpha1" && m["kind"] == "NetworkFabricIdentity" && m["name"] != nil {
			p.selects = fmt.Sprintf("%v/%v", m["namespace"], m["name"])
		}
	}
	exprs, _, _ := unstructured.NestedSlice(u.Object, "spec", "placement", "clusterAffinity", "labelSelector", "matchExpressions")
	for _, e := range exprs {
		m, _ := e.(map[string]any)
		if m["key"] != hubctl.LocationTopologyKey || m["operator"] != "In" {
			continue
		}
		values, _ := m["values"].([]any)
		for _, v := range values {
			p.locations = append(p.locations, fmt.Sprint(v))
		}
	}
	return p
}

// policy reads the policy called name.
func (s *placeScene) policy(name string) placed {
	u, err := s.dyn.Resource(hubctl.PolicyResource).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return placed{}
	}
	return readPolicy(u)
}

// placement reads the policy that places network's identity.
func (s *placeScene) placement(network string) placed {
	return s.policy(hubctl.PolicyName(s.team, network))
}

// identityLocations are the locations the identity's labels record, and
// whether the identity exists.
func (s *placeScene) identityLocations(network string) ([]string, bool) {
	u, err := s.dyn.Resource(hubctl.FabricIdentityResource).Namespace(s.team).Get(context.Background(), network, metav1.GetOptions{})
	if err != nil {
		return nil, false
	}
	var out []string
	for k, v := range u.GetLabels() {
		if l, ok := strings.CutPrefix(k, hubctl.LabelLocationPrefix); ok && v == "true" {
			out = append(out, l)
		}
	}
	slices.Sort(out)
	return out, true
}

// awaitPlaced waits until network's policy places it at exactly locations
// (sorted), in the fabric identity controller's shape, and its identity's
// labels record them.
func (s *placeScene) awaitPlaced(network string, locations ...string) {
	s.t.Helper()
	var p placed
	var labels []string
	deadline := time.Now().Add(time.Minute)
	for {
		p = s.placement(network)
		labels, _ = s.identityLocations(network)
		if p.found && p.labelled && p.overwrite && p.selects == s.team+"/"+network &&
			slices.Equal(p.locations, locations) && slices.Equal(labels, locations) {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s/%s not placed at %v within a minute: %s; identity labels record %v", s.team, network, locations, p, labels)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// holdsPlacement fails the test unless network is placed at exactly
// locations now.
func (s *placeScene) holdsPlacement(what, network string, locations ...string) {
	s.t.Helper()
	p := s.placement(network)
	labels, _ := s.identityLocations(network)
	if !p.found || !slices.Equal(p.locations, locations) || !slices.Equal(labels, locations) {
		s.t.Fatalf("%s: %s/%s is placed by %s, identity labels %v; want it still at %v", what, s.team, network, p, labels, locations)
	}
}

// event reports whether an event with reason names network.
func (s *placeScene) event(network, reason string) bool {
	events, err := s.cs.CoreV1().Events(s.team).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return false
	}
	for _, e := range events.Items {
		if e.Reason == reason && e.InvolvedObject.Name == network && e.InvolvedObject.Kind == "Network" {
			return true
		}
	}
	return false
}

// failWith answers a request as an API server that failed it.
func failWith(w http.ResponseWriter, code int, msg string) {
	st := metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
		Code: int32(code), Reason: metav1.StatusReasonInternalError, Message: msg}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(st)
}

// A network's fabric identity is placed by one policy at the locations of
// its contexts, moves with them, is unplaced (identity kept) when the last
// goes, and is collected with its network: identity, then policy, then
// claim.
func TestAPlacementFollowsItsNetworksContextsThroughTheBuiltHub(t *testing.T) {
	s := newPlaceScene(t)
	hub := s.start(ipamProject)
	s.liveNetwork(s.team, "net")
	policyName := hubctl.PolicyName(s.team, "net")
	if policyName != "cloud-fabric-identity-"+s.team+"-net" {
		t.Fatalf("PolicyName = %q", policyName)
	}

	s.context("ctx-a", "net", "iad")
	s.context("ctx-b", "net", "dfw")
	s.awaitPlaced("net", "dfw", "iad")
	s.awaitReady(hub)
	// Exactly one labelled policy selects the identity, and it is the
	// one of its name.
	list, err := s.dyn.Resource(hubctl.PolicyResource).List(context.Background(), metav1.ListOptions{LabelSelector: hubctl.LabelPolicy + "=true"})
	if err != nil {
		t.Fatal(err)
	}
	var selecting []string
	for i := range list.Items {
		if p := readPolicy(&list.Items[i]); p.selects == s.team+"/net" {
			selecting = append(selecting, list.Items[i].GetName())
		}
	}
	if len(selecting) != 1 || selecting[0] != policyName {
		t.Fatalf("labelled policies selecting %s/net: %v, want just %s", s.team, selecting, policyName)
	}
	s.await("the FabricIdentityPlaced event", 30*time.Second, func() bool { return s.event("net", "FabricIdentityPlaced") })
	if n := hub.metric("galactic_hub_placements_written_total"); n < 1 {
		t.Fatalf("galactic_hub_placements_written_total = %v after a placement", n)
	}

	// One context moves: the placement and the labels follow.
	s.moveContext("ctx-b", "lhr")
	s.awaitPlaced("net", "iad", "lhr")
	s.await("a moved withdrawal counted", 30*time.Second, func() bool {
		return hub.metric(`galactic_hub_placement_withdrawals_total{reason="moved"}`) >= 1
	})

	// No context left: the policy goes, the identity stays, unlabelled.
	s.deleteContext("ctx-a")
	s.deleteContext("ctx-b")
	s.await("the policy gone, the identity kept without location labels", time.Minute, func() bool {
		labels, ok := s.identityLocations("net")
		return !s.placement("net").found && ok && len(labels) == 0
	})
	if n := hub.metric(`galactic_hub_placement_withdrawals_total{reason="no_location"}`); n < 1 {
		t.Fatalf(`galactic_hub_placement_withdrawals_total{reason="no_location"} = %v`, n)
	}

	// Placed again, then the network goes: all three are collected, in
	// the seed's order.
	s.context("ctx-c", "net", "dfw")
	s.awaitPlaced("net", "dfw")
	mark := len(s.svc.Trace())
	s.cluster.Delete(t, hubctl.NetworkResource, s.team, "net")
	s.await("identity, policy and claim gone", time.Minute, func() bool {
		_, identity := s.identityLocations("net")
		_, err := s.claim(s.team, "net")
		return !identity && !s.placement("net").found && apierrors.IsNotFound(err)
	})
	trace := s.svc.Trace()[mark:]
	order := []string{
		"DELETE networkfabricidentities " + s.team + "/net",
		"DELETE clusterpropagationpolicies /" + policyName,
		"DELETE ipclaims " + s.platform + "/" + hubctl.ClaimName(s.team, "net"),
	}
	last := -1
	for _, w := range order {
		i := slices.Index(trace, w)
		if i < 0 || i < last {
			t.Fatalf("the collect's deletes are not %q in that order; writes since the network's delete:\n%s", order, strings.Join(trace, "\n"))
		}
		last = i
	}
	if n := hub.metric(`galactic_hub_placement_withdrawals_total{reason="collected"}`); n < 1 {
		t.Fatalf(`galactic_hub_placement_withdrawals_total{reason="collected"} = %v`, n)
	}
}

// A location leaves the placement only on a successful read of the
// network's contexts past the hub's cache: a read that fails, or that the
// API server does not answer within the hub's 10 s, withdraws nothing, and
// the withdrawal follows once a read succeeds.
func TestAFailedOrSlowReadOfTheContextsWithdrawsNothing(t *testing.T) {
	s := newPlaceScene(t)
	hub := s.start(ipamProject)
	s.liveNetwork(s.team, "net")
	s.context("ctx-a", "net", "dfw")
	s.context("ctx-b", "net", "iad")
	s.awaitPlaced("net", "dfw", "iad")
	s.awaitReady(hub)

	var failing atomic.Bool
	var reads atomic.Int64
	hold := make(chan struct{})
	var holding atomic.Bool
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { holding.Store(false); close(hold) }) }
	t.Cleanup(release)
	s.svc.Intercept(func(r ipamtest.Request, w http.ResponseWriter) bool {
		// The hub's own read of the contexts is a LIST of the network's
		// namespace; its informer lists and watches every namespace.
		if r.Verb != "LIST" || r.Resource != "networkcontexts" || r.Namespace != s.team {
			return false
		}
		reads.Add(1)
		if failing.Load() {
			failWith(w, http.StatusInternalServerError, "injected: etcd unavailable")
			return true
		}
		if holding.Load() {
			select {
			case <-hold:
			case <-time.After(15 * time.Second):
			}
		}
		return false
	})

	// Failed reads.
	failing.Store(true)
	s.deleteContext("ctx-b")
	s.await("the withdrawal held", 30*time.Second, func() bool {
		return hub.metric("galactic_hub_placement_withdrawals_held") >= 1
	})
	if reads.Load() == 0 {
		t.Fatal("the withdrawal is held but the hub did not read the contexts")
	}
	time.Sleep(3 * time.Second)
	s.holdsPlacement("while the contexts cannot be read", "net", "dfw", "iad")
	s.await("the FabricIdentityWithdrawalHeld event", 30*time.Second, func() bool { return s.event("net", "FabricIdentityWithdrawalHeld") })
	failing.Store(false)
	s.awaitPlaced("net", "dfw")
	s.await("the withdrawal no longer held", 30*time.Second, func() bool {
		return hub.metric("galactic_hub_placement_withdrawals_held") == 0
	})

	// Slow reads: held past the hub's 10 s.
	s.context("ctx-c", "net", "iad")
	s.awaitPlaced("net", "dfw", "iad")
	before := reads.Load()
	holding.Store(true)
	s.deleteContext("ctx-c")
	s.await("the withdrawal held on a read not answered", 40*time.Second, func() bool {
		return hub.metric("galactic_hub_placement_withdrawals_held") >= 1
	})
	if reads.Load() == before {
		t.Fatal("the withdrawal is held but the hub did not read the contexts")
	}
	time.Sleep(2 * time.Second)
	s.holdsPlacement("while the read of the contexts is not answered", "net", "dfw", "iad")
	release()
	s.awaitPlaced("net", "dfw")
	s.await("the withdrawal no longer held", 30*time.Second, func() bool {
		return hub.metric("galactic_hub_placement_withdrawals_held") == 0
	})
}

// A network being deleted (its finalizers hold it) keeps its placement
// when its contexts go, since its teardown needs the identity where it is;
// once the network is gone, identity and policy are collected.
func TestANetworkBeingDeletedKeepsItsPlacement(t *testing.T) {
	s := newPlaceScene(t)
	hub := s.start(ipamProject)
	networks := s.dyn.Resource(hubctl.NetworkResource).Namespace(s.team)
	unhold := func() error {
		_, err := networks.Patch(context.Background(), "net", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		return err
	}
	s.cluster.Apply(t, hubctl.NetworkResource, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.datumapis.com/v1alpha", "kind": "Network",
		"metadata": map[string]any{"namespace": s.team, "name": "net", "finalizers": []any{"test.galactic/hold"}},
		"spec":     map[string]any{},
	}})
	t.Cleanup(func() {
		if err := unhold(); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("remove the finalizer: %v", err)
		}
		s.cluster.Delete(t, hubctl.NetworkResource, s.team, "net")
	})
	s.await("the identity", time.Minute, func() bool { _, ok := s.identityLocations("net"); return ok })
	s.context("ctx-a", "net", "dfw")
	s.awaitPlaced("net", "dfw")
	s.awaitReady(hub)

	s.cluster.Delete(t, hubctl.NetworkResource, s.team, "net")
	s.await("the network's deletionTimestamp", 30*time.Second, func() bool {
		u, err := networks.Get(context.Background(), "net", metav1.GetOptions{})
		return err == nil && u.GetDeletionTimestamp() != nil
	})
	// The hub's informer hears of the deletionTimestamp in milliseconds.
	time.Sleep(3 * time.Second)
	s.deleteContext("ctx-a")
	time.Sleep(3 * time.Second)
	s.holdsPlacement("the network being deleted, its last context gone", "net", "dfw")
	if n := hub.metric(`galactic_hub_placement_withdrawals_total{reason="no_location"}`); n != 0 {
		t.Fatalf(`galactic_hub_placement_withdrawals_total{reason="no_location"} = %v for a network being deleted`, n)
	}

	if err := unhold(); err != nil {
		t.Fatal(err)
	}
	s.await("identity and policy gone with the network", time.Minute, func() bool {
		_, identity := s.identityLocations("net")
		return !identity && !s.placement("net").found
	})
}

// A hub killed between the delete of a gone network's identity and that of
// its policy leaves the policy; the next leader's startup sweep removes it
// (and releases the claim), removes the policies of the older per-location
// form, and leaves alone a policy without the placement label even when
// it names a gone network's identity, and a live network's policy.
func TestAPolicyLeftByAHubKilledBeforeItsUnplaceIsRemovedByTheNextLeader(t *testing.T) {
	s := newPlaceScene(t)
	policies := s.dyn.Resource(hubctl.PolicyResource)
	ctx := context.Background()

	// Not the placement label: another's, whatever it names.
	unlabelled := hubctl.PolicyName(s.team, "gone-net")
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "policy.karmada.io/v1alpha1", "kind": "ClusterPropagationPolicy",
		"metadata": map[string]any{"name": unlabelled},
		"spec": map[string]any{
			"conflictResolution": "Overwrite",
			"resourceSelectors": []any{map[string]any{
				"apiVersion": "cloud.datumapis.com/v1alpha1", "kind": "NetworkFabricIdentity", "namespace": s.team, "name": "gone-net"}},
			"placement": map[string]any{"clusterAffinity": map[string]any{"labelSelector": map[string]any{
				"matchExpressions": []any{map[string]any{"key": hubctl.LocationTopologyKey, "operator": "In", "values": []any{"dfw"}}}}}},
		},
	}}
	if _, err := policies.Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = policies.Delete(context.Background(), unlabelled, metav1.DeleteOptions{}) })

	id := "place-" + s.platform
	first := s.run(ipamProject, id)
	s.liveNetwork(s.team, "net")
	s.liveNetwork(s.team, "keep")
	s.context("ctx-a", "net", "dfw")
	s.context("ctx-k", "keep", "iad")
	s.awaitPlaced("net", "dfw")
	s.awaitPlaced("keep", "iad")
	s.awaitReady(first.hubProc)

	// The policy's delete is held until the hub is dead, then failed.
	policyName := hubctl.PolicyName(s.team, "net")
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	var arrived atomic.Bool
	s.svc.Intercept(func(r ipamtest.Request, w http.ResponseWriter) bool {
		if r.Verb != "DELETE" || r.Resource != "clusterpropagationpolicies" || r.Name != policyName {
			return false
		}
		arrived.Store(true)
		<-release
		failWith(w, http.StatusServiceUnavailable, "injected: the hub that sent this is dead")
		return true
	})
	s.cluster.Delete(t, hubctl.NetworkResource, s.team, "net")
	s.await("the identity deleted and the policy's delete arrived", time.Minute, func() bool {
		_, identity := s.identityLocations("net")
		return !identity && arrived.Load()
	})
	if _, err := s.claim(s.team, "net"); err != nil {
		t.Fatalf("the claim is not there while its policy's delete is held: %v", err)
	}
	first.kill(t)
	s.svc.Intercept(nil)
	releaseOnce.Do(func() { close(release) })
	if !s.placement("net").found {
		t.Fatal("the killed hub's policy delete went through")
	}

	// An older per-location policy, labelled, selecting identities by label.
	legacy := fmt.Sprintf("cloud-fabric-identity-dfw-%d", time.Now().UnixNano()%1e9)
	if _, err := policies.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "policy.karmada.io/v1alpha1", "kind": "ClusterPropagationPolicy",
		"metadata": map[string]any{"name": legacy, "labels": map[string]any{hubctl.LabelPolicy: "true"}},
		"spec": map[string]any{
			"conflictResolution": "Overwrite",
			"resourceSelectors": []any{map[string]any{
				"apiVersion": "cloud.datumapis.com/v1alpha1", "kind": "NetworkFabricIdentity",
				"labelSelector": map[string]any{"matchLabels": map[string]any{hubctl.LocationLabel("dfw"): "true"}}}},
			"placement": map[string]any{"clusterAffinity": map[string]any{"labelSelector": map[string]any{
				"matchExpressions": []any{map[string]any{"key": hubctl.LocationTopologyKey, "operator": "In", "values": []any{"dfw"}}}}}},
		},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = policies.Delete(context.Background(), legacy, metav1.DeleteOptions{}) })

	next := s.run(ipamProject, id)
	s.await("the policy the killed hub left removed", time.Minute, func() bool { return !s.placement("net").found })
	s.await("the older per-location policy removed", time.Minute, func() bool { return !s.policy(legacy).found })
	s.await("the gone network's claim released", time.Minute, func() bool {
		_, err := s.claim(s.team, "net")
		return apierrors.IsNotFound(err)
	})
	var counts string
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, scrape := next.get("/metrics")
		if metric(scrape, `galactic_hub_startup_sweep_policies_total{result="removed"}`) >= 1 &&
			metric(scrape, `galactic_hub_startup_sweep_policies_total{result="legacy_removed"}`) >= 1 &&
			metric(scrape, `galactic_hub_startup_sweep_policies_total{result="live"}`) >= 1 {
			break
		}
		counts = grepLines(scrape, "galactic_hub_startup_sweep_policies_total{", 4)
		if time.Now().After(deadline) {
			t.Fatalf("the next leader's sweep counts no removed, legacy_removed and live policy:\n%s", counts)
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.awaitReady(next.hubProc)
	time.Sleep(3 * time.Second)
	if p := s.policy(unlabelled); !p.found || p.labelled || p.selects != s.team+"/gone-net" || !slices.Equal(p.locations, []string{"dfw"}) {
		t.Fatalf("the policy without the label was touched: %s", p)
	}
	s.holdsPlacement("after the sweep", "keep", "iad")
}
