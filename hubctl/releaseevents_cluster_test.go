package hubctl_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/datum-cloud/galactic-node/hubctl"
)

// The release events against a real API server: written through
// events.k8s.io/v1, readable there by reason, and bounded in number.

// releaseEvents lists the events.k8s.io/v1 Events of reason in namespace
// ns regarding claim.
func releaseEvents(t *testing.T, h *hub, reason, claim string) []eventsv1.Event {
	t.Helper()
	list, err := h.cs.EventsV1().Events(h.ns).List(context.Background(), metav1.ListOptions{FieldSelector: "reason=" + reason})
	if err != nil {
		t.Fatalf("list events of reason %s: %v", reason, err)
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if claim == "" || e.Regarding.Name == claim {
			out = append(out, e)
		}
	}
	return out
}

// refuseDeletesOf makes the API server refuse (403) every DELETE of claim
// in h's platform namespace, through a ValidatingAdmissionPolicy: a
// refusal the server itself makes, as RBAC or an address service's
// admission would. It returns once a dry-run delete is refused, since the
// server takes up a new policy a moment after it is written.
func refuseDeletesOf(t *testing.T, h *hub, claim string) {
	t.Helper()
	ctx := context.Background()
	name := "refuse-" + h.ns
	adm := h.cs.AdmissionregistrationV1()
	fail, deny := admissionv1.Fail, admissionv1.Deny
	forbidden := metav1.StatusReasonForbidden
	if _, err := adm.ValidatingAdmissionPolicies().Create(ctx, &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Delete},
					Rule:       admissionv1.Rule{APIGroups: []string{hubctl.ClaimResource.Group}, APIVersions: []string{"*"}, Resources: []string{hubctl.ClaimResource.Resource}},
				},
			}}},
			Validations: []admissionv1.Validation{{
				Expression: "oldObject.metadata.name != '" + claim + "'",
				Message:    "this claim may not be deleted (test policy)",
				Reason:     &forbidden,
			}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the admission policy: %v", err)
	}
	t.Cleanup(func() { _ = adm.ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{}) })
	if _, err := adm.ValidatingAdmissionPolicyBindings().Create(ctx, &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionv1.ValidationAction{deny},
			MatchResources: &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": h.ns},
			}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("bind the admission policy: %v", err)
	}
	t.Cleanup(func() { _ = adm.ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{}) })
	claims := h.dyn.Resource(hubctl.ClaimResource).Namespace(h.ns)
	waitFor(t, "the API server to refuse the claim's delete", func() bool {
		err := claims.Delete(ctx, claim, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(err)
	})
}

// Guards the release events on a real API server: a gone network's claim
// released is a Normal ClaimReleased Event, readable through
// events.k8s.io/v1 by reason, regarding the claim and naming it and its
// network; a claim whose DELETE the API server refuses is a Warning
// ClaimReleaseRefused Event, once however often the release is retried,
// and the claim stays.
func TestAReleasedAndARefusedClaimAreEventsOnARealAPIServer(t *testing.T) {
	h := newHubWith(t, 10, false)
	in := h.startOpts(t, "", "", startOpts{manual: true, noPlacement: true})
	released, releasedNet := goneClaim(t, h, in)
	refused, refusedNet := goneClaim(t, h, in)
	refuseDeletesOf(t, h, refused)

	if err := in.ctl.Reconcile(context.Background(), releasedNet); err != nil {
		t.Fatalf("reconcile of the gone network: %v", err)
	}
	for range 3 { // the workers' retries
		if err := in.ctl.Reconcile(context.Background(), refusedNet); err == nil {
			t.Fatal("reconcile of the gone network whose claim's delete is refused: no error")
		}
	}

	var ev []eventsv1.Event
	waitFor(t, "a ClaimReleased Event", func() bool {
		ev = releaseEvents(t, h, hubctl.ReasonClaimReleased, released)
		return len(ev) > 0
	})
	e := ev[0]
	if len(ev) != 1 || e.Type != "Normal" || e.Action != hubctl.ActionRelease || e.Regarding.Kind != "IPClaim" || e.Regarding.UID == "" ||
		e.ReportingController != "galactic-hubctl-test" {
		t.Fatalf("ClaimReleased Events %+v: want one, Normal, action Release, regarding the IPClaim by its UID", ev)
	}
	for _, w := range []string{released, releasedNet.String()} {
		if !strings.Contains(e.Note, w) {
			t.Errorf("note %q does not name %s", e.Note, w)
		}
	}

	waitFor(t, "a ClaimReleaseRefused Event", func() bool {
		ev = releaseEvents(t, h, hubctl.ReasonClaimReleaseRefused, refused)
		return len(ev) > 0
	})
	// Give a second Event, or a series, the time to be written, were the
	// retries recorded.
	time.Sleep(time.Second)
	ev = releaseEvents(t, h, hubctl.ReasonClaimReleaseRefused, refused)
	if len(ev) != 1 || ev[0].Type != "Warning" || ev[0].Series != nil || !strings.Contains(ev[0].Note, refused) ||
		!strings.Contains(ev[0].Note, refusedNet.String()) || !strings.Contains(ev[0].Note, "test policy") {
		t.Fatalf("ClaimReleaseRefused Events %+v: want one Warning, no series, naming the claim, the network and the refusal", ev)
	}
	if _, err := h.dyn.Resource(hubctl.ClaimResource).Namespace(h.ns).Get(context.Background(), refused, metav1.GetOptions{}); err != nil {
		t.Fatalf("the refused claim: %v, want it kept", err)
	}
	if n := len(releaseEvents(t, h, hubctl.ReasonClaimReleased, refused)); n != 0 {
		t.Fatalf("%d ClaimReleased Events for the refused claim", n)
	}
}

// eventWrites counts the controller's writes of events (creates and
// patches through events.k8s.io) at the wire.
type eventWrites struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (e eventWrites) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.Contains(r.URL.Path, "/apis/events.k8s.io/") && (r.Method == http.MethodPost || r.Method == http.MethodPatch) {
		e.n.Add(1)
	}
	return e.rt.RoundTrip(r)
}

// Guards the cost of the release events: the startup sweep releasing 200
// gone networks' claims writes one Event per claim released, a create
// each, and nothing more (at most one write per release).
func TestReleasingManyClaimsWritesAtMostOneEventEachOnARealAPIServer(t *testing.T) {
	const n = 200
	h := newHubWith(t, n+10, false)
	var writes atomic.Int64
	cfg := rest.CopyConfig(h.cluster.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return eventWrites{rt, &writes} }
	h.ctlCfg = cfg
	in := h.startOpts(t, "", "", startOpts{manual: true, noPlacement: true})
	names := h.seedGoneClaims(t, n, int(time.Now().UnixNano()%1e9))
	waitFor(t, "the caches to hold the claims and their allocations", func() bool {
		for _, name := range names {
			_, claimed := in.claims.Get(name)
			_, allocated := in.allocations.Get(hubctl.AllocationName(h.ns, name))
			if !claimed || !allocated {
				return false
			}
		}
		return true
	})
	before := writes.Load()
	in.ctl.Sweep(context.Background())
	claims := h.dyn.Resource(hubctl.ClaimResource).Namespace(h.ns)
	left, err := claims.List(context.Background(), metav1.ListOptions{})
	if err != nil || len(left.Items) != 0 {
		t.Fatalf("claims left after the sweep: %v (%v)", len(left.Items), err)
	}
	waitFor(t, "an Event per claim released", func() bool {
		return len(releaseEvents(t, h, hubctl.ReasonClaimReleased, "")) >= n
	})
	// Let any write still queued land before counting.
	time.Sleep(2 * time.Second)
	events, got := releaseEvents(t, h, hubctl.ReasonClaimReleased, ""), writes.Load()-before
	t.Logf("%d claims released: %d Events, %d event API requests (%.2f per release)", n, len(events), got, float64(got)/n)
	if len(events) != n {
		t.Fatalf("%d ClaimReleased Events for %d claims released", len(events), n)
	}
	if got > n {
		t.Fatalf("%d event API requests for %d releases, want at most one each", got, n)
	}
	seen := map[string]bool{}
	for _, e := range events {
		seen[e.Regarding.Name] = true
	}
	for _, name := range names {
		if !seen[name] {
			t.Fatalf("no ClaimReleased Event regards claim %s", name)
		}
	}
}
