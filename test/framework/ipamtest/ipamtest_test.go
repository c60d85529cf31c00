package ipamtest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"github.com/datum-cloud/galactic-node/hubctl"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
	"github.com/datum-cloud/galactic-node/test/framework/ipamtest"
)

func TestMain(m *testing.M) { os.Exit(clustertest.Main(m)) }

// project is the platform project every test scopes its client to.
const project = "platform"

type fixture struct {
	c   *clustertest.Cluster
	s   *ipamtest.Service
	ns  string
	dyn dynamic.Interface // through the proxy, scoped to the project
}

// setup starts a proxy scoped to project in front of the shared cluster
// and makes a fresh namespace for the test.
func setup(t *testing.T, opts ipamtest.Options) *fixture {
	t.Helper()
	c := clustertest.Shared(t)
	opts.Project = project
	s := ipamtest.Start(t, c.Config, opts)
	ns := fmt.Sprintf("platform-%d", time.Now().UnixNano()%1e9)
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}}
	if _, err := c.Client.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
	dyn, err := dynamic.NewForConfig(s.Config(project))
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{c: c, s: s, ns: ns, dyn: dyn}
}

func claim(ns, name, policy string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "ipam.miloapis.com/v1alpha1", "kind": "IPClaim",
		"metadata": map[string]any{"namespace": ns, "name": name},
		"spec":     map[string]any{"ipFamily": "IPv6", "prefixLength": int64(64), "reclaimPolicy": policy},
	}}
}

func (f *fixture) claims() dynamic.ResourceInterface {
	return f.dyn.Resource(hubctl.ClaimResource).Namespace(f.ns)
}

func (f *fixture) create(t *testing.T, c *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	out, err := f.claims().Create(context.Background(), c, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create claim %s: %v", c.GetName(), err)
	}
	return out
}

func (f *fixture) remove(t *testing.T, name string) {
	t.Helper()
	if err := f.claims().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete claim %s: %v", name, err)
	}
}

// upstream reads an object straight from the API server.
func (f *fixture) upstream(gvr schema.GroupVersionResource, name string) (*unstructured.Unstructured, error) {
	return f.c.Client.Resource(gvr).Namespace(f.ns).Get(context.Background(), name, metav1.GetOptions{})
}

// do sends a raw request through the proxy and returns the code, the
// Content-Type and the decoded body.
func do(t *testing.T, method, url string, body any) (int, string, map[string]any) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		t.Fatalf("%s %s: decode answer: %v", method, url, err)
	}
	return res.StatusCode, res.Header.Get("Content-Type"), out
}

func (f *fixture) claimsURL() string {
	return f.s.URL() + ipamtest.ProjectPrefix(project) + "/apis/ipam.miloapis.com/v1alpha1/namespaces/" + f.ns + "/ipclaims"
}

func str(obj map[string]any, fields ...string) string {
	s, _, _ := unstructured.NestedString(obj, fields...)
	return s
}

func eventually(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func statusOf(t *testing.T, err error) metav1.Status {
	t.Helper()
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		t.Fatalf("want an API status, got %v", err)
	}
	return st.Status()
}

// A create answers 201 with the claim already Bound to a new allocation;
// a Delete-policy delete frees the block for the next claim.
func TestCreateBindsSynchronously(t *testing.T) {
	f := setup(t, ipamtest.Options{})
	code, ctype, body := do(t, http.MethodPost, f.claimsURL(), claim(f.ns, "a", "Delete").Object)
	if code != http.StatusCreated || ctype != "application/json" {
		t.Fatalf("create: %d %q %v, want 201 application/json", code, ctype, body)
	}
	alloc := hubctl.AllocationName(f.ns, "a")
	if got := str(body, "status", "phase"); got != "Bound" {
		t.Errorf("phase %q, want Bound", got)
	}
	if got := str(body, "status", "allocatedCIDR"); got != "fd00:0:1::/64" {
		t.Errorf("allocatedCIDR %q, want fd00:0:1::/64", got)
	}
	if got := str(body, "status", "boundAllocationRef", "name"); got != alloc {
		t.Errorf("boundAllocationRef %q, want %q", got, alloc)
	}
	if id, err := hubctl.FabricIDFromBlock(str(body, "status", "allocatedCIDR")); err != nil || id == 0 {
		t.Errorf("block yields fabric ID %d, %v", id, err)
	}
	a, err := f.upstream(hubctl.AllocationResource, alloc)
	if err != nil {
		t.Fatalf("allocation: %v", err)
	}
	if str(a.Object, "spec", "claimRef", "name") != "a" || str(a.Object, "spec", "reclaimPolicy") != "Delete" ||
		str(a.Object, "status", "phase") != "Ready" || str(a.Object, "status", "allocatedCIDR") != "fd00:0:1::/64" {
		t.Errorf("allocation %v", a.Object)
	}

	b := f.create(t, claim(f.ns, "b", "Delete"))
	if got := str(b.Object, "status", "allocatedCIDR"); got != "fd00:0:2::/64" {
		t.Errorf("second block %q, want fd00:0:2::/64", got)
	}
	f.remove(t, "a")
	if _, err := f.upstream(hubctl.AllocationResource, alloc); !apierrors.IsNotFound(err) {
		t.Errorf("allocation of a deleted Delete claim: %v, want NotFound", err)
	}
	c := f.create(t, claim(f.ns, "c", "Delete"))
	if got := str(c.Object, "status", "allocatedCIDR"); got != "fd00:0:1::/64" {
		t.Errorf("block after a release %q, want the freed fd00:0:1::/64", got)
	}
	if _, err := f.claims().Create(context.Background(), claim(f.ns, "c", "Delete"), metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
		t.Errorf("duplicate create: %v, want AlreadyExists", err)
	}
	if got := f.s.Requests()["POST ipclaims"]; got != 4 {
		t.Errorf("POST ipclaims counted %d, want 4", got)
	}
}

// ipam's Delete never reads the preconditions: a wrong UID deletes anyway,
// and the answer is the claim in phase Releasing, not a Status.
func TestDeleteIgnoresPreconditions(t *testing.T) {
	f := setup(t, ipamtest.Options{})
	a := f.create(t, claim(f.ns, "a", "Delete"))
	wrong := types.UID("00000000-0000-0000-0000-000000000000")
	code, _, body := do(t, http.MethodDelete, f.claimsURL()+"/a", metav1.DeleteOptions{
		TypeMeta:      metav1.TypeMeta{Kind: "DeleteOptions", APIVersion: "v1"},
		Preconditions: &metav1.Preconditions{UID: &wrong},
	})
	if code != http.StatusOK {
		t.Fatalf("delete with a wrong UID: %d %v, want 200", code, body)
	}
	if body["kind"] != "IPClaim" || str(body, "metadata", "uid") != string(a.GetUID()) || str(body, "status", "phase") != "Releasing" {
		t.Errorf("answer %v, want the claim %s in phase Releasing", body, a.GetUID())
	}
	if _, ok, _ := unstructured.NestedFieldNoCopy(body, "metadata", "deletionTimestamp"); ok {
		t.Errorf("answer carries a deletionTimestamp: %v", body)
	}
	if _, err := f.upstream(hubctl.ClaimResource, "a"); !apierrors.IsNotFound(err) {
		t.Errorf("claim after delete: %v, want NotFound", err)
	}
	if _, err := f.upstream(hubctl.AllocationResource, hubctl.AllocationName(f.ns, "a")); !apierrors.IsNotFound(err) {
		t.Errorf("allocation after delete: %v, want NotFound", err)
	}
	if err := f.claims().Delete(context.Background(), "a", metav1.DeleteOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("delete of a missing claim: %v, want NotFound", err)
	}

	// The seam: a claim re-created between the client's read and its
	// delete is the one deleted, whatever UID the client named.
	b := f.create(t, claim(f.ns, "b", "Delete"))
	var again atomic.Bool
	var recreated atomic.Value
	f.s.SetBeforeClaimDelete(func(ns, name string) {
		// Runs in the proxy's goroutine: no t.Fatal here.
		if name != "b" || again.Swap(true) {
			return
		}
		if err := f.claims().Delete(context.Background(), "b", metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete b in the window: %v", err)
			return
		}
		c, err := f.claims().Create(context.Background(), claim(ns, "b", "Delete"), metav1.CreateOptions{})
		if err != nil {
			t.Errorf("re-create b in the window: %v", err)
			return
		}
		recreated.Store(c.GetUID())
	})
	uid := b.GetUID()
	code, _, body = do(t, http.MethodDelete, f.claimsURL()+"/b", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if code != http.StatusOK {
		t.Fatalf("delete: %d %v", code, body)
	}
	if got := types.UID(str(body, "metadata", "uid")); got == uid || got != recreated.Load() {
		t.Errorf("deleted claim UID %s, want the re-created %v (the client named %s)", got, recreated.Load(), uid)
	}
	if got := f.s.Deletes(); got != 3 {
		t.Errorf("Deletes %d, want 3", got)
	}
}

// Under Retain the allocation outlives its claim, unbound.
func TestRetainKeepsAllocation(t *testing.T) {
	f := setup(t, ipamtest.Options{})
	c := f.create(t, claim(f.ns, "r", "Retain"))
	f.remove(t, "r")
	a, err := f.upstream(hubctl.AllocationResource, hubctl.AllocationName(f.ns, "r"))
	if err != nil {
		t.Fatalf("retained allocation: %v", err)
	}
	if _, ok, _ := unstructured.NestedFieldNoCopy(a.Object, "spec", "claimRef"); ok {
		t.Errorf("retained allocation keeps a claimRef: %v", a.Object["spec"])
	}
	if str(a.Object, "status", "allocatedCIDR") != str(c.Object, "status", "allocatedCIDR") || str(a.Object, "spec", "reclaimPolicy") != "Retain" {
		t.Errorf("retained allocation %v", a.Object)
	}
	conds, _, _ := unstructured.NestedSlice(a.Object, "status", "conditions")
	if len(conds) != 1 {
		t.Fatalf("conditions %v, want Bound=False Retained", conds)
	}
	cond := conds[0].(map[string]any)
	if cond["type"] != "Bound" || cond["status"] != "False" || cond["reason"] != "Retained" ||
		cond["message"] != "the claim was deleted under reclaimPolicy Retain; this address is still held" {
		t.Errorf("condition %v", cond)
	}
}

// Each ipam version meets a retained allocation its own way.
func TestRetainedModes(t *testing.T) {
	for _, mode := range []ipamtest.Retained{ipamtest.RetainedRebind, ipamtest.RetainedPlainConflict, ipamtest.RetainedCauseConflict} {
		t.Run(mode.String(), func(t *testing.T) {
			f := setup(t, ipamtest.Options{Retained: mode})
			first := f.create(t, claim(f.ns, "r", "Retain"))
			cidr := str(first.Object, "status", "allocatedCIDR")
			f.remove(t, "r")
			alloc := hubctl.AllocationName(f.ns, "r")
			again, err := f.claims().Create(context.Background(), claim(f.ns, "r", "Retain"), metav1.CreateOptions{})
			switch mode {
			case ipamtest.RetainedRebind:
				if err != nil {
					t.Fatalf("re-create: %v, want re-bound", err)
				}
				if str(again.Object, "status", "phase") != "Bound" || str(again.Object, "status", "allocatedCIDR") != cidr {
					t.Errorf("re-created claim %v, want Bound to %s", again.Object["status"], cidr)
				}
				if _, ok, _ := unstructured.NestedFieldNoCopy(again.Object, "status", "conditions"); ok {
					t.Errorf("re-bound claim has conditions: %v", again.Object["status"])
				}
				a, err := f.upstream(hubctl.AllocationResource, alloc)
				if err != nil {
					t.Fatal(err)
				}
				conds, _, _ := unstructured.NestedSlice(a.Object, "status", "conditions")
				if str(a.Object, "spec", "claimRef", "name") != "r" || str(a.Object, "status", "phase") != "Ready" || len(conds) != 1 ||
					conds[0].(map[string]any)["reason"] != "Reclaimed" || conds[0].(map[string]any)["status"] != "True" ||
					conds[0].(map[string]any)["message"] != `recovered by replacement claim "r"` {
					t.Errorf("re-bound allocation %v", a.Object)
				}
				f.remove(t, "r")
				misfit := claim(f.ns, "r", "Retain")
				misfit.Object["spec"].(map[string]any)["prefixLength"] = int64(56)
				_, err = f.claims().Create(context.Background(), misfit, metav1.CreateOptions{})
				want := `Operation cannot be fulfilled on ipclaims.ipam.miloapis.com "r": ipam: retained allocation does not match this claim: it is a /64 and this claim asks for a /56`
				if !apierrors.IsConflict(err) || statusOf(t, err).Message != want {
					t.Errorf("misfit create: %v, want Conflict %q", err, want)
				}
				misfit = claim(f.ns, "r", "Retain")
				misfit.Object["spec"].(map[string]any)["className"] = "other"
				_, err = f.claims().Create(context.Background(), misfit, metav1.CreateOptions{})
				if !apierrors.IsConflict(err) || !strings.HasSuffix(err.Error(), `it was allocated under class "" and this claim names "other"`) {
					t.Errorf("other class: %v", err)
				}
			case ipamtest.RetainedPlainConflict, ipamtest.RetainedCauseConflict:
				if !apierrors.IsConflict(err) {
					t.Fatalf("re-create: %v, want Conflict", err)
				}
				st := statusOf(t, err)
				want := fmt.Sprintf(`Operation cannot be fulfilled on ipclaims.ipam.miloapis.com "r": an allocation under this identity already exists: IPAllocation %q, retained by an earlier claim of the same name; delete it to reuse the name`, alloc)
				if st.Message != want {
					t.Errorf("message %q, want %q", st.Message, want)
				}
				var causes []metav1.StatusCause
				if st.Details != nil {
					causes = st.Details.Causes
				}
				if mode == ipamtest.RetainedPlainConflict && len(causes) != 0 {
					t.Errorf("causes %v, want none", causes)
				}
				if mode == ipamtest.RetainedCauseConflict && (len(causes) != 1 || causes[0].Type != "AllocationRetained" || causes[0].Message != alloc || causes[0].Field != alloc) {
					t.Errorf("causes %v, want AllocationRetained naming %s", causes, alloc)
				}
				if _, err := f.upstream(hubctl.ClaimResource, "r"); !apierrors.IsNotFound(err) {
					t.Errorf("refused claim stored: %v", err)
				}
			}

			// A live claim's name: AlreadyExists; an allocation still
			// bound to a claim deleted behind the service: Conflict.
			f.create(t, claim(f.ns, "live", "Delete"))
			if _, err := f.claims().Create(context.Background(), claim(f.ns, "live", "Delete"), metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
				t.Errorf("duplicate: %v, want AlreadyExists", err)
			}
			f.c.Delete(t, hubctl.ClaimResource, f.ns, "live")
			_, err = f.claims().Create(context.Background(), claim(f.ns, "live", "Delete"), metav1.CreateOptions{})
			want := fmt.Sprintf(`Operation cannot be fulfilled on ipclaims.ipam.miloapis.com "live": ipam: retained allocation does not match this claim: an allocation under this identity is already bound to "project/%s/ipam.miloapis.com/ipclaims/%s/live"`, project, f.ns)
			if !apierrors.IsConflict(err) || statusOf(t, err).Message != want {
				t.Errorf("bound allocation: %v, want Conflict %q", err, want)
			}
		})
	}
}

// Milo's quota admission refuses a create at the limit, and a deleted
// claim's unit comes back only QuotaReturnDelay after the delete.
func TestQuota(t *testing.T) {
	const delay = 1500 * time.Millisecond
	for _, newest := range []bool{false, true} {
		t.Run(fmt.Sprintf("newest=%v", newest), func(t *testing.T) {
			f := setup(t, ipamtest.Options{QuotaLimit: 1, QuotaReturnDelay: delay, NewestQuotaWording: newest})
			f.create(t, claim(f.ns, "a", "Delete"))
			_, err := f.claims().Create(context.Background(), claim(f.ns, "b", "Delete"), metav1.CreateOptions{})
			text := ipamtest.MiloQuotaDenied
			if newest {
				text = fmt.Sprintf(ipamtest.MiloQuotaDeniedNewest, "ipclaims")
			}
			want := `ipclaims.ipam.miloapis.com "b" is forbidden: ` + text
			if !apierrors.IsForbidden(err) || statusOf(t, err).Message != want {
				t.Fatalf("create over quota: %v, want Forbidden %q", err, want)
			}
			deleted := time.Now()
			f.remove(t, "a")
			if _, err := f.claims().Create(context.Background(), claim(f.ns, "b", "Delete"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
				t.Fatalf("create right after the delete: %v, want Forbidden (the unit is not back yet)", err)
			}
			eventually(t, "the unit comes back", 3*delay, func() bool {
				_, err := f.claims().Create(context.Background(), claim(f.ns, "b", "Delete"), metav1.CreateOptions{})
				return err == nil
			})
			if since := time.Since(deleted); since < delay {
				t.Errorf("unit back %v after the delete, want at least %v", since, delay)
			}
		})
	}
}

// A request without the project's prefix sees an empty keyspace and may
// not write; other groups pass through.
func TestUntenanted(t *testing.T) {
	f := setup(t, ipamtest.Options{})
	for _, n := range []string{"a", "b", "c"} {
		f.create(t, claim(f.ns, n, "Delete"))
	}
	ctx := context.Background()
	// ipam ignores limit: one page holds every claim.
	page, err := f.claims().List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil || len(page.Items) != 3 || page.GetContinue() != "" {
		t.Fatalf("scoped list with limit 1: %v, %v, want all 3 claims and no continue", page, err)
	}

	bare, err := dynamic.NewForConfig(f.s.Config(""))
	if err != nil {
		t.Fatal(err)
	}
	claims := bare.Resource(hubctl.ClaimResource).Namespace(f.ns)
	list, err := claims.List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 0 || list.GetKind() != "IPClaimList" || list.GetResourceVersion() == "" {
		t.Fatalf("untenanted list: %v, %v, want an empty IPClaimList with a resourceVersion", list, err)
	}
	allocs, err := bare.Resource(hubctl.AllocationResource).Namespace(f.ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(allocs.Items) != 0 || allocs.GetKind() != "IPAllocationList" {
		t.Fatalf("untenanted allocation list: %v, %v", allocs, err)
	}
	if _, err := claims.Get(ctx, "a", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("untenanted get: %v, want NotFound", err)
	}
	want := ipamtest.Untenanted().Message
	if !strings.Contains(want, "iam.miloapis.com/parent-name") {
		t.Errorf("untenanted refusal %q names no parent-name extra", want)
	}
	_, err = claims.Create(ctx, claim(f.ns, "d", "Delete"), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || statusOf(t, err).Message != want {
		t.Errorf("untenanted create: %v, want Forbidden %q", err, want)
	}
	if err := claims.Delete(ctx, "a", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("untenanted delete: %v, want Forbidden", err)
	}
	if _, err := claims.Update(ctx, claim(f.ns, "a", "Delete"), metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("untenanted update: %v, want Forbidden", err)
	}
	if _, err := f.upstream(hubctl.ClaimResource, "a"); err != nil {
		t.Errorf("claim after refused writes: %v", err)
	}
	if _, err := bare.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).Get(ctx, f.ns, metav1.GetOptions{}); err != nil {
		t.Errorf("untenanted read of another group: %v, want passed through", err)
	}

	// A watch stays open and silent; an informer (a watch-list) syncs empty.
	w, err := claims.Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
	if err != nil {
		t.Fatalf("untenanted watch: %v", err)
	}
	defer w.Stop()
	inf := informer(bare, f.ns)
	stop := make(chan struct{})
	defer close(stop)
	go inf.Run(stop)
	f.create(t, claim(f.ns, "e", "Delete"))
	syncCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced) {
		t.Fatal("untenanted informer never synced")
	}
	select {
	case ev := <-w.ResultChan():
		t.Errorf("untenanted watch sent %s %v", ev.Type, ev.Object)
	case <-time.After(500 * time.Millisecond):
	}
	if keys := inf.GetStore().ListKeys(); len(keys) != 0 {
		t.Errorf("untenanted informer holds %v", keys)
	}
}

func informer(dyn dynamic.Interface, ns string) cache.SharedIndexInformer {
	ri := dyn.Resource(hubctl.ClaimResource).Namespace(ns)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (kruntime.Object, error) {
			return ri.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return ri.Watch(ctx, o)
		},
	}
	return cache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 0, cache.Indexers{})
}

// RefuseCreates answers ipam's refusals, each as ipam words it.
func TestRefuseCreates(t *testing.T) {
	f := setup(t, ipamtest.Options{})
	cases := []struct {
		st      *metav1.Status
		code    int32
		message string
	}{
		{ipamtest.NoDefaultClass("IPv6"), 400, "ipam: no default class for address family: IPv6"},
		{ipamtest.PrefixOutOfRange(40, "x", 48, 64), 400, `prefixLength 40 is outside class "x" allowedPrefixLengths [48, 64]`},
		{ipamtest.ScopeRequired("network", "x"), 400, `scope is missing role "network" required by uniqueWithin (class "x")`},
		{ipamtest.PoolExhausted("project/p/pool", 64, 0, 100), 507, `ipam: pool "project/p/pool" cannot satisfy a /64 (largest free /0, 100% utilized)`},
		{ipamtest.NamespaceMissing("gone"), 403, "ipclaims.ipam.miloapis.com is forbidden: namespace gone does not exist: an address bound into it would have nothing to collect it"},
		{ipamtest.NamespaceTerminating("going"), 403, "ipclaims.ipam.miloapis.com is forbidden: unable to create new content in namespace going because it is being terminated: an address bound into a terminating namespace would outlive everything that could release it"},
	}
	for _, c := range cases {
		f.s.RefuseCreates(c.st)
		code, _, body := do(t, http.MethodPost, f.claimsURL(), claim(f.ns, "a", "Delete").Object)
		if int32(code) != c.code || body["kind"] != "Status" || body["message"] != c.message {
			t.Errorf("refused create: %d %v, want %d %q", code, body, c.code, c.message)
		}
	}
	f.s.RefuseCreates(ipamtest.PoolExhausted("project/p/pool", 64, 0, 100))
	_, err := f.claims().Create(context.Background(), claim(f.ns, "a", "Delete"), metav1.CreateOptions{})
	st := statusOf(t, err)
	if st.Reason != "InsufficientStorage" || st.Details == nil || st.Details.Name != "project/p/pool" || st.Details.Kind != "IPPool" || st.Details.Group != "ipam.miloapis.com" {
		t.Errorf("exhaustion status %+v", st)
	}
	if _, err := f.upstream(hubctl.ClaimResource, "a"); !apierrors.IsNotFound(err) {
		t.Errorf("refused claim stored: %v", err)
	}
	f.s.RefuseCreates(nil)
	f.create(t, claim(f.ns, "a", "Delete"))
}

// During an Outage an informer misses a delete, and learns nothing of it
// afterwards: no 410, so no relist. A watch started after is unaffected.
func TestOutageDropsEvents(t *testing.T) {
	f := setup(t, ipamtest.Options{})
	ctx := context.Background()
	inf := informer(f.dyn, f.ns)
	stop := make(chan struct{})
	defer close(stop)
	go inf.Run(stop)
	syncCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced) {
		t.Fatal("informer never synced")
	}
	has := func(name string) bool {
		_, ok, _ := inf.GetStore().GetByKey(f.ns + "/" + name)
		return ok
	}
	// Events on the informer's watch, so that its end is not a "very short
	// watch", which client-go answers by listing again.
	f.create(t, claim(f.ns, "x", "Delete"))
	eventually(t, "the informer sees x", 5*time.Second, func() bool { return has("x") })
	before, err := f.claims().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}

	type started struct {
		w   watch.Interface
		err error
	}
	raw := make(chan started, 1)
	f.s.Outage(func() {
		go func() {
			w, err := f.claims().Watch(ctx, metav1.ListOptions{ResourceVersion: before.GetResourceVersion()})
			raw <- started{w, err}
		}()
		f.remove(t, "x")
		eventually(t, "the informer's and the raw watch held", 5*time.Second, func() bool { return f.s.HeldWatches() >= 2 })
	})
	r := <-raw
	if r.err != nil {
		t.Fatalf("watch held by the outage: %v", r.err)
	}
	defer r.w.Stop()
	f.create(t, claim(f.ns, "y", "Delete"))
	eventually(t, "the informer sees y after the outage", 5*time.Second, func() bool { return has("y") })
	if !has("x") {
		t.Error("the informer learnt of the delete made during the outage")
	}
	timeout := time.After(5 * time.Second)
	for seen := false; !seen; {
		select {
		case ev, ok := <-r.w.ResultChan():
			if !ok {
				t.Fatal("resumed watch ended before y")
			}
			if ev.Type == watch.Error || ev.Type == watch.Deleted {
				t.Fatalf("resumed watch sent %s %v", ev.Type, ev.Object)
			}
			u, isObj := ev.Object.(*unstructured.Unstructured)
			seen = isObj && ev.Type == watch.Added && u.GetName() == "y"
		case <-timeout:
			t.Fatal("resumed watch never sent y")
		}
	}
	if got := f.s.Requests()["WATCH ipclaims"]; got < 3 {
		t.Errorf("WATCH ipclaims counted %d, want the informer's two and the raw one", got)
	}

	later, err := f.claims().Watch(ctx, metav1.ListOptions{ResourceVersion: before.GetResourceVersion()})
	if err != nil {
		t.Fatal(err)
	}
	defer later.Stop()
	// TX1's MODIFIED (phase Releasing), then the DELETED the outage hid.
	var got []string
	timeout = time.After(5 * time.Second)
	for len(got) < 2 {
		select {
		case ev := <-later.ResultChan():
			u, _ := ev.Object.(*unstructured.Unstructured)
			if u == nil || u.GetName() != "x" {
				continue
			}
			got = append(got, fmt.Sprintf("%s %s", ev.Type, str(u.Object, "status", "phase")))
		case <-timeout:
			t.Fatalf("a watch started after the outage sent only %v", got)
		}
	}
	if want := []string{"MODIFIED Releasing", "DELETED Releasing"}; !slices.Equal(got, want) {
		t.Errorf("a watch started after the outage sent %v of x, want %v", got, want)
	}
}

// The package is a test part: no binary may link it.
func TestNothingShippedImportsIt(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	// The go on PATH, as the integration tests' builds use it.
	cmd := exec.Command("go", "list", "-e", "-deps", "./cmd/...")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/...: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasSuffix(pkg, "/test/framework/ipamtest") {
			t.Fatalf("a command links %s", pkg)
		}
	}
}
