package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory/kubeinventory"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
)

// These tests hold admission to the node daemon's parsers: a VPCAttachment
// identity or a BGPAdvertisement name is admitted exactly when
// identity.ParseBase62 / identity.ParseAdvertisementName can read it (or,
// for status fields, when it is empty: no identity yet), first by the CEL
// rules of deploy/crds, then, on a cluster whose CRDs lack them, by the
// ValidatingAdmissionPolicy of deploy/admission.

var (
	validatingPolicies = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicies"}
	validatingBindings = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicybindings"}
)

// unreadableMessage ends every refusal of what the daemon cannot read, and
// oneSpellingMessage every refusal of a second spelling of an identity.
const (
	unreadableMessage  = "(the node daemon cannot read it otherwise)"
	oneSpellingMessage = "one spelling of each identity, which the node daemon selects by"
)

// absent stands for a status field the object does not carry at all.
const absent = "<absent>"

type statusCase struct{ vpc, att string }

// statusCases are the edges of status.vpc (1..2^48-1, base62 1hVwxnaA7 is
// the largest) and status.vpcAttachment (0..65535, h31), with leading
// zeros, 16 and 17 characters, characters outside base62, and the empty and
// absent fields of an attachment that has no identity yet.
var statusCases = []statusCase{
	{"", ""}, {absent, absent}, {absent, "5"}, {"5", absent}, {"", "5"}, {"5", ""},
	{"1", "0"}, {"0", "0"}, {"000", "1"}, {"0000000000000000", "1"}, {"0001", "001"},
	{"1hVwxnaA7", "h31"}, {"1hVwxnaA8", "0"}, {"1hVwxnaB0", "0"}, {"2", "h32"}, {"2", "h40"}, {"2", "i00"}, {"2", "1000"},
	{"00000001hVwxnaA7", "0000000000000h31"}, {"000000001hVwxnaA7", "0"}, {"1", "00000000000000000"},
	{"ZZZZZZZZ", "Z"}, {"ZZZZZZZZZ", "0"}, {"zzzzzzzzzzzzzzzz", "0"}, {"10000000000", "0"},
	{"1-2", "0"}, {"1", "_"}, {"é", "0"}, {"1", " 1"},
}

// nameCases are BGPAdvertisement names at the same edges in both readings:
// hex only (ffffffffffff-ffff), base62 only (1hvwxnaa7-h31, g-1), both
// (10-13), neither, and names not of the form <vpc>-<attachment>.
var nameCases = []string{
	"1-0", "0-0", "00-0", "0-1", "10-13", "1-ffff", "1-10000", "ffffffffffff-ffff", "1000000000000-0", "0ffffffffffff-0",
	"1hvwxnaa7-h31", "1hvwxnaa7-h32", "zzzzzzzzz-0", "g-1", "h31-h31", "ffff-10000",
	"0000000000000001-0", "00000000000000001-0", "1-0000000000000000", "1-00000000000000000",
	"abc", "a-b-c", "1--1", "-1", "1-", "1.2-3", "1-2.a",
}

// statusReadable is the daemon's verdict on a status: each field absent,
// empty, or what ParseBase62 reads.
func statusReadable(c statusCase) bool {
	vpcOK := c.vpc == absent || c.vpc == ""
	if !vpcOK {
		_, err := identity.ParseBase62(c.vpc, "0")
		vpcOK = err == nil
	}
	attOK := c.att == absent || c.att == ""
	if !attOK {
		_, err := identity.ParseBase62("1", c.att)
		attOK = err == nil
	}
	return vpcOK && attOK
}

func nameReadable(name string) bool {
	_, err := identity.ParseAdvertisementName(name)
	return err == nil
}

// oneSpelling: no field or name segment has a leading zero ("0" itself is
// the one spelling of attachment 0). The candidates inventory selects
// objects by these strings, so admission refuses any other spelling.
func oneSpelling(segments ...string) bool {
	for _, s := range segments {
		if len(s) > 1 && s[0] == '0' {
			return false
		}
	}
	return true
}

// statusAdmissible is what the rules admit: readable, in one spelling.
func statusAdmissible(c statusCase) bool { return statusReadable(c) && oneSpelling(c.vpc, c.att) }

// nameAdmissible is what the rules admit: readable, in one spelling.
func nameAdmissible(name string) bool {
	return nameReadable(name) && oneSpelling(strings.Split(name, "-")...)
}

// schemaAdmitsStatus is what the CRD's schema admits without its rules:
// pattern ^[0-9a-zA-Z]*$ and maxLength 16, which StartUnvalidated keeps.
func schemaAdmitsStatus(c statusCase) bool {
	ok := func(s string) bool {
		if s == absent {
			return true
		}
		if len(s) > 16 {
			return false
		}
		for _, r := range s {
			if !strings.ContainsRune("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", r) {
				return false
			}
		}
		return true
	}
	return ok(c.vpc) && ok(c.att)
}

// schemaAdmitsName is what the API server admits as an object name.
func schemaAdmitsName(name string) bool { return len(validation.IsDNS1123Subdomain(name)) == 0 }

// admission is a cluster under test, and what a refusal by the rules under
// test says (enforcer, besides unreadableMessage); enforcer "" means no
// rule is expected to refuse anything the schema admits.
type admission struct {
	c        *clustertest.Cluster
	enforcer string
}

func (a admission) ensureNamespace(t *testing.T, ns string) {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}}
	_, err := a.c.Client.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).Create(context.Background(), obj, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
}

// withStatus returns obj with the status clustertest.Attachment writes
// and the identity of c; absent fields are left out. (A create drops the
// status: it is the status subresource's.)
func withStatus(obj *unstructured.Unstructured, c statusCase) *unstructured.Unstructured {
	obj = obj.DeepCopy()
	status := clustertest.Attachment(obj.GetNamespace(), obj.GetName(), "", "").Object["status"].(map[string]any)
	obj.Object["status"] = status
	delete(status, "vpc")
	delete(status, "vpcAttachment")
	if c.vpc != absent {
		status["vpc"] = c.vpc
	}
	if c.att != absent {
		status["vpcAttachment"] = c.att
	}
	return obj
}

// setStatus creates an attachment without identity, as galactic's CNI
// chain does, then sets its identity through the status subresource; it
// returns the latter's error.
func (a admission) setStatus(t *testing.T, ns, name string, c statusCase) error {
	t.Helper()
	ri := a.c.Client.Resource(kubeinventory.AttachmentResource).Namespace(ns)
	created, err := ri.Create(context.Background(), clustertest.Attachment(ns, name, "", ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create VPCAttachment %s/%s without identity: %v", ns, name, err)
	}
	_, err = ri.UpdateStatus(context.Background(), withStatus(created, c), metav1.UpdateOptions{})
	return err
}

// verdict checks one outcome: admitted exactly when want, and a refusal
// of what the schema admits made by the rules under test, in their words.
func (a admission) verdict(t *testing.T, what string, err error, want, schemaOK bool) {
	t.Helper()
	switch {
	case err == nil && !want:
		t.Errorf("%s admitted, want it refused", what)
	case err != nil && want:
		t.Errorf("%s refused, want it admitted: %v", what, err)
	case err != nil && !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) && !apierrors.IsBadRequest(err):
		t.Errorf("%s: %v, want a refusal", what, err)
	case err != nil && schemaOK && (!strings.Contains(err.Error(), a.enforcer) ||
		!strings.Contains(err.Error(), unreadableMessage) && !strings.Contains(err.Error(), oneSpellingMessage)):
		t.Errorf("%s refused, but not by %q saying %q or %q: %v", what, a.enforcer, unreadableMessage, oneSpellingMessage, err)
	}
}

// checkTable creates an attachment per status case and an advertisement
// per name case in ns, for real, and checks each outcome. It returns how
// many objects the daemon cannot read were admitted.
func (a admission) checkTable(t *testing.T, ns string) (unreadableAdmitted int) {
	t.Helper()
	a.ensureNamespace(t, ns)
	for i, c := range statusCases {
		err := a.setStatus(t, ns, fmt.Sprintf("edge-%d", i), c)
		want := schemaAdmitsStatus(c) && (a.enforcer == "" || statusAdmissible(c))
		a.verdict(t, fmt.Sprintf("VPCAttachment status vpc=%q vpcAttachment=%q", c.vpc, c.att), err, want, schemaAdmitsStatus(c))
		if err == nil && !statusAdmissible(c) {
			unreadableAdmitted++
		}
	}
	ri := a.c.Client.Resource(kubeinventory.AdvertisementResource).Namespace(ns)
	for _, name := range nameCases {
		_, err := ri.Create(context.Background(), clustertest.Advertisement(ns, name, "node-a"), metav1.CreateOptions{})
		want := schemaAdmitsName(name) && (a.enforcer == "" || nameAdmissible(name))
		a.verdict(t, fmt.Sprintf("BGPAdvertisement %q", name), err, want, schemaAdmitsName(name))
		if err == nil && !nameAdmissible(name) {
			unreadableAdmitted++
		}
	}
	return unreadableAdmitted
}

// randomFrom draws n strings of 0 to 17 characters from alphabet.
func randomFrom(r *rand.Rand, alphabet string, n int) []string {
	out := make([]string, n)
	for i := range out {
		var b strings.Builder
		for range r.IntN(18) {
			b.WriteByte(alphabet[r.IntN(len(alphabet))])
		}
		out[i] = b.String()
	}
	return out
}

// checkRandom compares admission with the parsers on a few hundred random
// values drawn from the digits of the bounds (base62 1hVwxnaA7 and h31,
// hex ffffffffffff and ffff) and their neighbours. Each is a server-side
// dry run, so nothing is stored and the requests run side by side.
func (a admission) checkRandom(t *testing.T, ns string) {
	t.Helper()
	a.ensureNamespace(t, ns)
	ctx := context.Background()
	dry := []string{metav1.DryRunAll}
	atts := a.c.Client.Resource(kubeinventory.AttachmentResource).Namespace(ns)
	base, err := atts.Create(ctx, clustertest.Attachment(ns, "random-base", "", ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create VPCAttachment %s/random-base: %v", ns, err)
	}
	advs := a.c.Client.Resource(kubeinventory.AdvertisementResource).Namespace(ns)

	r := rand.New(rand.NewPCG(7, 11))
	var checks []func()
	for _, v := range randomFrom(r, "0012789ahiuvwxzAHUVWZ", 150) {
		c := statusCase{v, "0"}
		checks = append(checks, func() {
			_, err := atts.UpdateStatus(ctx, withStatus(base, c), metav1.UpdateOptions{DryRun: dry})
			a.verdict(t, fmt.Sprintf("VPCAttachment status vpc=%q", v), err, schemaAdmitsStatus(c) && (a.enforcer == "" || statusAdmissible(c)), schemaAdmitsStatus(c))
		})
	}
	for _, v := range randomFrom(r, "000123ghiAZ", 150) {
		c := statusCase{"1", v}
		checks = append(checks, func() {
			_, err := atts.UpdateStatus(ctx, withStatus(base, c), metav1.UpdateOptions{DryRun: dry})
			a.verdict(t, fmt.Sprintf("VPCAttachment status vpcAttachment=%q", v), err, schemaAdmitsStatus(c) && (a.enforcer == "" || statusAdmissible(c)), schemaAdmitsStatus(c))
		})
	}
	// Names: two segments of the lower-case alphabet names allow, mostly
	// joined by one '-'.
	segs := randomFrom(r, "0001fghvwxz", 400)
	for i := 0; i < 200; i++ {
		name := segs[2*i] + "-" + segs[2*i+1]
		if i%10 == 0 {
			name = strings.ReplaceAll(name, "0", "-")
		}
		checks = append(checks, func() {
			_, err := advs.Create(ctx, clustertest.Advertisement(ns, name, "node-a"), metav1.CreateOptions{DryRun: dry})
			a.verdict(t, fmt.Sprintf("BGPAdvertisement %q", name), err, schemaAdmitsName(name) && (a.enforcer == "" || nameAdmissible(name)), schemaAdmitsName(name))
		})
	}
	work := make(chan func())
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for check := range work {
				check()
			}
		})
	}
	for _, check := range checks {
		work <- check
	}
	close(work)
	wg.Wait()
}

// deleteIn deletes this test's objects of gvr in ns; the shared cluster's
// other tests list attachments and advertisements in every namespace.
func deleteIn(t *testing.T, c *clustertest.Cluster, gvr schema.GroupVersionResource, ns string) {
	t.Helper()
	list, err := c.Client.Resource(gvr).Namespace(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Errorf("list %s in %s: %v", gvr.Resource, ns, err)
		return
	}
	for _, o := range list.Items {
		c.Delete(t, gvr, ns, o.GetName())
	}
}

// The CRDs of deploy/crds refuse what the daemon cannot read. A deleted
// rule fails the verdicts of the rows the schema alone admits but the
// parsers refuse: status vpc "1hVwxnaA8" (2^48), "0", attachment "h32"
// (65536), names "1--1", "a-b-c"... are then "admitted, want it refused".
func TestAdmissionByTheCRDsRefusesWhatTheDaemonCannotRead(t *testing.T) {
	c := clustertest.Shared(t)
	a := admission{c: c, enforcer: "Invalid value"}
	for _, ns := range []string{"admission-crd", "admission-crd-random"} {
		t.Cleanup(func() {
			deleteIn(t, c, kubeinventory.AttachmentResource, ns)
			deleteIn(t, c, kubeinventory.AdvertisementResource, ns)
		})
	}
	if n := a.checkTable(t, "admission-crd"); n != 0 {
		t.Errorf("%d objects the daemon cannot read were admitted", n)
	}
	a.checkRandom(t, "admission-crd-random")

	// The name rule runs on create only (optionalOldSelf): an
	// advertisement stays updatable, as its router annotates it.
	advs := c.Client.Resource(kubeinventory.AdvertisementResource).Namespace("admission-crd")
	adv, err := advs.Get(context.Background(), "10-13", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get BGPAdvertisement 10-13: %v", err)
	}
	adv.SetAnnotations(map[string]string{"galactic.datum.net/netns.fedcba987654": "/var/run/netns/cni-2"})
	if _, err := advs.Update(context.Background(), adv, metav1.UpdateOptions{}); err != nil {
		t.Errorf("update BGPAdvertisement 10-13's annotations: %v", err)
	}
}

// On a cluster whose CRDs are another system's (no rules), the policy of
// the default install refuses what the daemon cannot read; without it
// the same objects are admitted. A deleted or broken policy fails the
// bounded wait for it to refuse "a-b-c" (Fatal), and a deleted validation
// of it fails the table's "admitted, want it refused" rows.
func TestAdmissionPolicyRefusesWhatTheDaemonCannotRead(t *testing.T) {
	c := clustertest.StartUnvalidated(t)
	defer func() { _ = c.Env.Stop() }()
	ctx := context.Background()

	// Without the policy, the table's unreadable objects are admitted:
	// the refusals below are the policy's doing.
	none := admission{c: c}
	if n := none.checkTable(t, "before-policy"); n < 10 {
		t.Fatalf("without the policy only %d unreadable objects were admitted: StartUnvalidated's CRDs refuse them themselves", n)
	}
	// Objects stored before the policy, which it must leave updatable.
	none.ensureNamespace(t, "legacy")
	if err := none.setStatus(t, "legacy", "legacy", statusCase{"1hVwxnaA8", "h32"}); err != nil {
		t.Fatalf("without the policy: %v", err)
	}
	if _, err := c.Client.Resource(kubeinventory.AdvertisementResource).Namespace("legacy").Create(ctx, clustertest.Advertisement("legacy", "a-b-c", "node-a"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("without the policy: %v", err)
	}

	// The policy and binding as the default install ships them.
	var applied []string
	for _, obj := range build(t, "../deploy") {
		gvr := map[string]schema.GroupVersionResource{"ValidatingAdmissionPolicy": validatingPolicies, "ValidatingAdmissionPolicyBinding": validatingBindings}[obj.GetKind()]
		if gvr.Resource == "" {
			continue
		}
		if _, err := c.Client.Resource(gvr).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
		applied = append(applied, obj.GetKind()+"/"+obj.GetName())
	}
	if len(applied) != 2 {
		t.Fatalf("the default install ships %v, want one ValidatingAdmissionPolicy and its binding", applied)
	}
	awaitPolicy(t, c)

	a := admission{c: c, enforcer: "ValidatingAdmissionPolicy 'galactic-tenant-identity'"}
	if n := a.checkTable(t, "after-policy"); n != 0 {
		t.Errorf("%d objects the daemon cannot read were admitted", n)
	}
	a.checkRandom(t, "after-policy-random")

	// Stored values are kept, as CRD validation ratcheting keeps them, but
	// not changed to other unreadable ones.
	atts := c.Client.Resource(kubeinventory.AttachmentResource).Namespace("legacy")
	legacy, err := atts.Get(ctx, "legacy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	legacy.SetLabels(map[string]string{"touched": "yes"})
	if legacy, err = atts.Update(ctx, legacy, metav1.UpdateOptions{}); err != nil {
		t.Errorf("relabel an attachment stored before the policy: %v", err)
	}
	if legacy != nil {
		if err := unstructured.SetNestedField(legacy.Object, "node-b", "status", "node"); err != nil {
			t.Fatal(err)
		}
		if legacy, err = atts.UpdateStatus(ctx, legacy, metav1.UpdateOptions{}); err != nil {
			t.Errorf("update the status of an attachment stored before the policy, identity unchanged: %v", err)
		}
	}
	if legacy != nil {
		a.verdict(t, "changing a stored unreadable vpc to another", updateVPC(ctx, c, legacy, "1hVwxnaA9"), false, true)
	}
	advs := c.Client.Resource(kubeinventory.AdvertisementResource).Namespace("legacy")
	adv, err := advs.Get(ctx, "a-b-c", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	adv.SetAnnotations(map[string]string{"galactic.datum.net/netns.fedcba987654": "/var/run/netns/cni-2"})
	if _, err := advs.Update(ctx, adv, metav1.UpdateOptions{}); err != nil {
		t.Errorf("annotate an advertisement stored before the policy: %v", err)
	}
}

func updateVPC(ctx context.Context, c *clustertest.Cluster, obj *unstructured.Unstructured, vpc string) error {
	obj = obj.DeepCopy()
	if err := unstructured.SetNestedField(obj.Object, vpc, "status", "vpc"); err != nil {
		return fmt.Errorf("set status.vpc: %w", err)
	}
	_, err := c.Client.Resource(kubeinventory.AttachmentResource).Namespace(obj.GetNamespace()).UpdateStatus(ctx, obj, metav1.UpdateOptions{})
	return err
}

// awaitPolicy waits, bounded, until the API server enforces the policy on
// both kinds: it loads policies and bindings through informers, a moment
// after they are created.
func awaitPolicy(t *testing.T, c *clustertest.Cluster) {
	t.Helper()
	ctx := context.Background()
	admission{c: c}.ensureNamespace(t, "probe")
	atts := c.Client.Resource(kubeinventory.AttachmentResource).Namespace("probe")
	probe, err := atts.Create(ctx, clustertest.Attachment("probe", "probe", "", ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create the probe attachment: %v", err)
	}
	bad := withStatus(probe, statusCase{"0", "0"})
	advs := c.Client.Resource(kubeinventory.AdvertisementResource).Namespace("probe")
	dry := []string{metav1.DryRunAll}
	deadline := time.Now().Add(time.Minute)
	for {
		_, errAtt := atts.UpdateStatus(ctx, bad, metav1.UpdateOptions{DryRun: dry})
		_, errAdv := advs.Create(ctx, clustertest.Advertisement("probe", "a-b-c", "node-a"), metav1.CreateOptions{DryRun: dry})
		if errAtt != nil && errAdv != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the policy refuses nothing a minute after it was created: status vpc 0: %v; name a-b-c: %v", errAtt, errAdv)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
