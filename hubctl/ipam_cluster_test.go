package hubctl_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/datum-cloud/galactic-node/hubctl"
	"github.com/datum-cloud/galactic-node/test/framework/ipamtest"
)

// The controller against the address service as milo-os/ipam's code
// answers (test/framework/ipamtest: a real API server behind a proxy that does
// what ipam does), beside the CRD model the other cluster tests use.

const platformProject = "platform"

// newIpamHub is a hub whose controllers reach the claims through an
// ipam-shaped service scoped to the platform project.
func newIpamHub(t *testing.T, opts ipamtest.Options) (*hub, *ipamtest.Service) {
	t.Helper()
	h := newHubWith(t, 1000, false)
	opts.Project = platformProject
	svc := ipamtest.Start(t, h.cluster.Config, opts)
	h.ctlCfg = svc.Config(platformProject)
	return h, svc
}

// claimClient writes claims through the service, as another writer would.
func claimClient(t *testing.T, svc *ipamtest.Service, ns string) dynamic.ResourceInterface {
	t.Helper()
	dyn, err := dynamic.NewForConfig(svc.Config(platformProject))
	if err != nil {
		t.Fatal(err)
	}
	return dyn.Resource(hubctl.ClaimResource).Namespace(ns)
}

func (h *hub) claimOf(team, network string) (*unstructured.Unstructured, error) {
	return h.dyn.Resource(hubctl.ClaimResource).Namespace(h.ns).Get(context.Background(), hubctl.ClaimName(team, network), metav1.GetOptions{})
}

func eventsFor(t *testing.T, h *hub, ns, name, reason string) []corev1.Event {
	t.Helper()
	events, err := h.cs.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Event
	for _, e := range events.Items {
		if e.Reason == reason && (name == "" || e.InvolvedObject.Name == name) {
			out = append(out, e)
		}
	}
	return out
}

// Item 2: a returning name keeps its block in each form ipam answers: the
// 201 that re-binds it (a41cd6f1), a plain 409 decided by reading the
// retained allocation (012be054), and the seed's 409 with cause. A
// re-bound block holds a claim, so galactic_hub_unclaimed_blocks stays 0;
// an adopted one holds none and is counted.
func TestAReturningNameKeepsItsBlockAgainstIpam(t *testing.T) {
	for _, tc := range []struct {
		form      ipamtest.Retained
		claimed   bool
		unclaimed float64
	}{
		{ipamtest.RetainedRebind, true, 0},
		{ipamtest.RetainedPlainConflict, false, 1},
		{ipamtest.RetainedCauseConflict, false, 1},
	} {
		t.Run(tc.form.String(), func(t *testing.T) {
			h, _ := newIpamHub(t, ipamtest.Options{Retained: tc.form})
			in := h.start(t, "", "")
			team := "r-" + h.ns
			h.network(t, team, "net-a")
			waitFor(t, "A's identity", func() bool { _, ok := h.identity(team, "net-a"); return ok })
			id, _ := h.identity(team, "net-a")
			h.cluster.Delete(t, hubctl.NetworkResource, team, "net-a")
			waitFor(t, "A's claim released", func() bool { _, err := h.claimOf(team, "net-a"); return apierrors.IsNotFound(err) })
			h.network(t, team, "net-a")
			waitFor(t, "A's identity again", func() bool { _, ok := h.identity(team, "net-a"); return ok })
			if got, _ := h.identity(team, "net-a"); got != id {
				t.Fatalf("the returning name got fabric ID %d, want its block's %d", got, id)
			}
			claim, err := h.claimOf(team, "net-a")
			if claimed := err == nil; claimed != tc.claimed {
				t.Fatalf("the returning name holds a claim: %v (%v), want %v", claimed, err, tc.claimed)
			}
			if tc.claimed {
				if phase, _, _ := unstructured.NestedString(claim.Object, "status", "phase"); phase != "Bound" {
					t.Fatalf("the re-bound claim is %s", phase)
				}
			}
			waitFor(t, "the unclaimed count", func() bool { return testutil.ToFloat64(hubctl.UnclaimedBlocks(in.metrics)) == tc.unclaimed })
		})
	}
}

// Item 3: Milo's quota 403 is quota: counted and evented as such, the
// network waits, and it is claimed within the fast retry once the unit
// comes back, which Milo does asynchronously after the claim is deleted
// (here 2 s later), not with the delete.
func TestMilosQuotaRefusalWaitsForTheUnitToComeBack(t *testing.T) {
	for _, newest := range []bool{false, true} {
		t.Run(fmt.Sprintf("newest wording %v", newest), func(t *testing.T) {
			h, _ := newIpamHub(t, ipamtest.Options{QuotaLimit: 1, QuotaReturnDelay: 2 * time.Second, NewestQuotaWording: newest})
			in := h.startWith(t, "", "", slowBackoff)
			team := "q-" + h.ns
			h.network(t, team, "net-a")
			waitFor(t, "A's identity", func() bool { _, ok := h.identity(team, "net-a"); return ok })
			h.network(t, team, "net-b")
			waitFor(t, "B refused as quota", func() bool { return testutil.ToFloat64(quotaRefusals(in.metrics)) >= 1 })
			if got := testutil.ToFloat64(hubctl.NetworksRefused(in.metrics, hubctl.RefusalQuota)); got != 1 {
				t.Fatalf("networks refused for quota = %v, want 1", got)
			}
			waitFor(t, "the quota event on B", func() bool { return len(eventsFor(t, h, team, "net-b", "FabricIdentityQuotaExceeded")) == 1 })
			deleted := time.Now()
			h.cluster.Delete(t, hubctl.NetworkResource, team, "net-a")
			waitFor(t, "B's identity once A's unit is back", func() bool { _, ok := h.identity(team, "net-b"); return ok })
			t.Logf("B claimed %s after A's network was deleted (the unit comes back 2 s after its claim)", time.Since(deleted).Round(time.Millisecond))
		})
	}
}

// Item 6: each refusal class is named once per cause, on the network and
// the metric, and the network retried slowly.
func TestEachRefusalIsNamedOnTheNetworkAndTheMetricAgainstIpam(t *testing.T) {
	for _, tc := range []struct {
		what   string
		status *metav1.Status
		class  string
		cause  string
		reason string
	}{
		{"no default class", ipamtest.NoDefaultClass("IPv6"), hubctl.RefusalConfiguration, hubctl.CauseBadRequest, "FabricIdentityClaimMisconfigured"},
		{"prefix outside the class", ipamtest.PrefixOutOfRange(64, "fabric", 48, 56), hubctl.RefusalConfiguration, hubctl.CauseBadRequest, "FabricIdentityClaimMisconfigured"},
		{"scope required", ipamtest.ScopeRequired("network", "fabric"), hubctl.RefusalConfiguration, hubctl.CauseBadRequest, "FabricIdentityClaimMisconfigured"},
		{"namespace missing", ipamtest.NamespaceMissing("platform"), hubctl.RefusalConfiguration, hubctl.CauseNamespaceMissing, "FabricIdentityClaimMisconfigured"},
		{"namespace terminating", ipamtest.NamespaceTerminating("platform"), hubctl.RefusalConfiguration, hubctl.CauseNamespaceTerminating, "FabricIdentityClaimMisconfigured"},
		{"pool exhausted", ipamtest.PoolExhausted("fabric", 64, 65, 100), hubctl.RefusalExhausted, hubctl.RefusalExhausted, "FabricIdentityPoolExhausted"},
	} {
		t.Run(tc.what, func(t *testing.T) {
			h, svc := newIpamHub(t, ipamtest.Options{})
			svc.RefuseCreates(tc.status)
			in := h.startWith(t, "", "", slowBackoff)
			team := "c-" + h.ns
			h.network(t, team, "net-a")
			waitFor(t, "the refusal named", func() bool {
				return testutil.ToFloat64(hubctl.Refusals(in.metrics, tc.class, tc.cause)) == 1 && len(eventsFor(t, h, team, "net-a", tc.reason)) == 1
			})
			if got := testutil.ToFloat64(hubctl.NetworksRefused(in.metrics, tc.class)); got != 1 {
				t.Fatalf("networks refused (%s) = %v, want 1", tc.class, got)
			}
			// Slowly: not on the fast backoff of a transient error.
			before := svc.Requests()["POST ipclaims"]
			time.Sleep(2 * time.Second)
			if after := svc.Requests()["POST ipclaims"]; after-before > 1 {
				t.Fatalf("%d creates in 2 s after a configuration refusal, want it retried slowly", after-before)
			}
			svc.RefuseCreates(nil)
			h.touch(t, team, "net-a")
			waitFor(t, "A's identity once the refusal is mended", func() bool { _, ok := h.identity(team, "net-a"); return ok })
			waitFor(t, "the network no longer counted refused", func() bool {
				return testutil.ToFloat64(hubctl.NetworksRefused(in.metrics, tc.class)) == 0
			})
		})
	}
}

// Item 7: a claim deleted while the watch was down, resumed without 410
// past the events it missed (ipam before a41cd6f1), is seen within the
// relist interval: it leaves the cache, and the network waiting for its
// quota unit is claimed.
func TestAMissedDeleteIsCaughtWithinTheRelistInterval(t *testing.T) {
	const relist = 3 * time.Second
	h, svc := newIpamHub(t, ipamtest.Options{QuotaLimit: 1})
	in := h.startOpts(t, "", "", startOpts{tune: slowBackoff, relist: relist})
	team := "w-" + h.ns
	h.network(t, team, "net-a")
	waitFor(t, "A's identity", func() bool { _, ok := h.identity(team, "net-a"); return ok })
	h.network(t, team, "net-b")
	waitFor(t, "B refused as quota", func() bool { return testutil.ToFloat64(quotaRefusals(in.metrics)) >= 1 })
	claimA := hubctl.ClaimName(team, "net-a")
	svc.Outage(func() {
		// The informers' watches back and held: they resume past this
		// delete.
		waitFor(t, "the claim and allocation watches held", func() bool { return svc.HeldWatches() >= 2 })
		if err := claimClient(t, svc, h.ns).Delete(context.Background(), claimA, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete A's claim during the outage: %v", err)
		}
	})
	resumed := time.Now()
	if _, ok := in.claims.Get(claimA); !ok {
		t.Log("the cache lost the claim before the relist (the watch delivered the delete after all)")
	}
	waitFor(t, "the missed delete seen and B claimed", func() bool {
		_, cached := in.claims.Get(claimA)
		_, ok := h.identity(team, "net-b")
		return !cached && ok
	})
	if took := time.Since(resumed); took > relist+5*time.Second {
		t.Fatalf("caught up %s after the watch resumed, want within the relist interval %s and a few seconds", took, relist)
	}
	t.Logf("caught up %s after the watch resumed (relist every %s)", time.Since(resumed).Round(time.Millisecond), relist)
}

// Item 5: a hub whose reads are not scoped to the platform project sees
// ipam's empty lists: with identities in view, it calls itself blind.
func TestAnUnscopedHubIsBlindAgainstIpam(t *testing.T) {
	h, svc := newIpamHub(t, ipamtest.Options{})
	scoped := h.start(t, "", "")
	team := "s-" + h.ns
	h.network(t, team, "net-a")
	waitFor(t, "A's identity", func() bool { _, ok := h.identity(team, "net-a"); return ok })
	if scoped.ctl.Blind() {
		t.Fatal("the scoped hub calls itself blind")
	}
	h.ctlCfg = svc.Config("")
	unscoped := h.start(t, "", "")
	waitFor(t, "the unscoped hub blind", func() bool {
		return unscoped.ctl.Blind() && testutil.ToFloat64(hubctl.ClaimsNotVisible(unscoped.metrics)) == 1
	})
	waitFor(t, "the event on the platform namespace", func() bool {
		return len(eventsFor(t, h, h.ns, h.ns, "FabricIdentityClaimsNotVisible")) > 0
	})
	if ev := eventsFor(t, h, h.ns, h.ns, "FabricIdentityClaimsNotVisible"); !strings.Contains(ev[0].Message, "scoped to the platform project") {
		t.Fatalf("event: %q", ev[0].Message)
	}
}

// The startup sweep against ipam: a restart while a network was gone
// releases that network's claim (its block retained, claimRef cleared) and
// leaves a live network's claim and identity alone.
func TestTheSweepReleasesOnlyGoneNetworksClaimsAgainstIpam(t *testing.T) {
	h, _ := newIpamHub(t, ipamtest.Options{})
	first := h.start(t, "", "")
	team := "sw-" + h.ns
	for _, n := range []string{"live", "gone"} {
		h.network(t, team, n)
		waitFor(t, n+"'s identity", func() bool { _, ok := h.identity(team, n); return ok })
	}
	live, _ := h.identity(team, "live")
	first.stop()
	h.cluster.Delete(t, hubctl.NetworkResource, team, "gone")
	second := h.start(t, "", "")
	waitFor(t, "the gone network's claim released by the sweep", func() bool {
		_, err := h.claimOf(team, "gone")
		return apierrors.IsNotFound(err)
	})
	alloc, err := h.dyn.Resource(hubctl.AllocationResource).Namespace(h.ns).Get(context.Background(),
		hubctl.AllocationName(h.ns, hubctl.ClaimName(team, "gone")), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the gone network's allocation: %v; want it retained", err)
	}
	if ref, _, _ := unstructured.NestedString(alloc.Object, "spec", "claimRef", "name"); ref != "" {
		t.Fatalf("the retained allocation still names claim %q", ref)
	}
	if _, err := h.claimOf(team, "live"); err != nil {
		t.Fatalf("the live network's claim: %v", err)
	}
	if got, ok := h.identity(team, "live"); !ok || got != live {
		t.Fatalf("the live network's identity %d %v, want %d", got, ok, live)
	}
	if got := testutil.ToFloat64(hubctl.Restored(second.metrics)); got != 0 {
		t.Fatalf("restored = %v with no race", got)
	}
}

// The retention lease read from IPClass and IPPool objects on a real API
// server (ipam's types: cluster-scoped, metav1.Duration strings): under
// the floor, a gone network's claim is kept and the hub says why (metric,
// event on the platform namespace, status); raised to the floor or above,
// the claim is released and the promise names the lease.
func TestALeaseUnderTheFloorHoldsReleasesOnARealAPIServer(t *testing.T) {
	h := newHub(t, 10)
	ctx := context.Background()
	serveLeaseCRDs(t, h)
	class := "fabric-" + h.ns
	classes := h.dyn.Resource(hubctl.ClassResource)
	if _, err := classes.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "ipam.miloapis.com/v1alpha1", "kind": "IPClass",
		"metadata": map[string]any{"name": class},
		"spec":     map[string]any{"ipFamily": "IPv6", "retentionLease": "1h"},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = classes.Delete(context.Background(), class, metav1.DeleteOptions{}) })
	pools := h.dyn.Resource(hubctl.PoolResource)
	if _, err := pools.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "ipam.miloapis.com/v1alpha1", "kind": "IPPool",
		"metadata": map[string]any{"name": class},
		"spec":     map[string]any{"classNames": []any{class}, "maxRetentionLease": "2000h"},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pools.Delete(context.Background(), class, metav1.DeleteOptions{}) })

	leases := hubctl.NewLeaseWatcher(h.dyn, class, nil)
	leases.Interval = 200 * time.Millisecond
	if err := leases.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go leases.Run(wctx, nil)
	in := h.startWith(t, "", "", func(c *hubctl.Config) {
		c.ClassName, c.Leases, c.MinRetentionLease = class, leases, hubctl.DefaultMinRetentionLease
	})
	team := "l-" + h.ns
	h.network(t, team, "net-a")
	waitFor(t, "A's identity", func() bool { _, ok := h.identity(team, "net-a"); return ok })
	h.cluster.Delete(t, hubctl.NetworkResource, team, "net-a")
	waitFor(t, "releases held", func() bool { return testutil.ToFloat64(hubctl.ReleasesHeld(in.metrics)) == 1 })
	waitFor(t, "the event on the platform namespace", func() bool {
		return len(eventsFor(t, h, h.ns, h.ns, "FabricIdentityReleasesHeld")) > 0
	})
	time.Sleep(time.Second) // retries under the hold release nothing either
	if _, err := h.claimOf(team, "net-a"); err != nil {
		t.Fatalf("the claim under a 1h lease: %v, want it kept", err)
	}
	if st := in.ctl.Status(); !strings.Contains(st.ReleasesHeld, "1h0m0s") {
		t.Fatalf("status says %+v, want the hold and the lease", st)
	}

	patch := []byte(`{"spec":{"retentionLease":"200h"}}`)
	if _, err := classes.Patch(ctx, class, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the claim released once the lease is long enough", func() bool {
		_, err := h.claimOf(team, "net-a")
		return apierrors.IsNotFound(err)
	})
	if got := testutil.ToFloat64(hubctl.ReleasesHeld(in.metrics)); got != 0 {
		t.Fatalf("releases_held = %v after the release", got)
	}
	if st := in.ctl.Status(); st.ReleasesHeld != "" || !strings.Contains(st.Promise, "200h0m0s (class "+class+")") {
		t.Fatalf("status %+v, want no hold and the 200h promise", st)
	}
}

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// serveLeaseCRDs installs ipam's IPClass and IPPool CRDs (testdata) for
// one test, and removes them after it: served and empty, they would hold
// the releases of every other test's hub (EffectiveLease).
func serveLeaseCRDs(t *testing.T, h *hub) {
	t.Helper()
	for _, file := range []string{"ipam.miloapis.com_ipclasses.yaml", "ipam.miloapis.com_ippools.yaml"} {
		raw, err := os.ReadFile(filepath.Join("testdata", file))
		if err != nil {
			t.Fatal(err)
		}
		crd := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(raw, &crd.Object); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		crds := h.dyn.Resource(crdResource)
		if _, err := crds.Create(context.Background(), crd, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create CRD %s: %v", crd.GetName(), err)
		}
		t.Cleanup(func() { _ = crds.Delete(context.Background(), crd.GetName(), metav1.DeleteOptions{}) })
	}
	for _, gvr := range []schema.GroupVersionResource{hubctl.ClassResource, hubctl.PoolResource} {
		waitFor(t, gvr.Resource+" served", func() bool {
			_, err := h.dyn.Resource(gvr).List(context.Background(), metav1.ListOptions{})
			return err == nil
		})
	}
}
