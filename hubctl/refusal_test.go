package hubctl

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var claimsGR = schema.GroupResource{Group: "ipam.miloapis.com", Resource: "ipclaims"}

// Every refusal of a claim create, built as the server that sends it
// builds it: kube-apiserver's admission and registry, Milo's quota
// admission (milo-os/milo pkg/quota/admission/plugin.go,
// userFacingClaimError), and ipam's storage and filters
// (internal/registry/ipam/ipclaim/storage.go, internal/access/namespace.go,
// cmd/ipam/admission.go, internal/registry/errors NewPoolExhausted).
func TestEachRefusalOfAClaimIsClassifiedByStatusAndReason(t *testing.T) {
	const name, ns = "fabric-identity.team.a", "platform"
	exhausted := &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusInsufficientStorage,
		Reason: metav1.StatusReason("InsufficientStorage"), Message: `ipam: pool "project/p/ipam.miloapis.com/ippools/fabric" cannot satisfy a /64 (largest free /65, 100% utilized)`,
		Details: &metav1.StatusDetails{Name: "fabric", Group: "ipam.miloapis.com", Kind: "IPPool"}}}
	for _, tc := range []struct {
		what  string
		err   error
		want  error  // a sentinel errors.Is finds, or nil
		cause string // the ConfigError's cause, or ""
	}{
		{"kube ResourceQuota", apierrors.NewForbidden(claimsGR, name, errors.New("exceeded quota: claims, requested: count/ipclaims.ipam.miloapis.com=1, used: count/ipclaims.ipam.miloapis.com=1, limited: count/ipclaims.ipam.miloapis.com=1")), ErrQuota, ""},
		{"Milo quota, first wording", apierrors.NewForbidden(claimsGR, name, errors.New("Insufficient quota resources available. Review your quota usage and reach out to support if you need additional resources.")), ErrQuota, ""},
		{"Milo quota, newest wording", apierrors.NewForbidden(claimsGR, name, errors.New("You've reached your quota for this resource type (ipclaims). Delete unused resources to free up capacity, or contact support to request a higher limit.")), ErrQuota, ""},
		{"Milo quota timed out", apierrors.NewForbidden(claimsGR, name, errors.New("Your request took too long to be checked against your quota. Please try again in a moment — if this keeps happening, contact support.")), nil, ""},
		{"Milo quota still cleaning up", apierrors.NewForbidden(claimsGR, name, errors.New("We're still cleaning up from a previous attempt to create this resource. Please try again in a few seconds.")), nil, ""},
		{"no default class", apierrors.NewBadRequest("ipam: no default class for address family: IPv6"), nil, CauseBadRequest},
		{"prefix outside the class", apierrors.NewBadRequest(`prefixLength 64 is outside class "fabric" allowedPrefixLengths [48, 56]`), nil, CauseBadRequest},
		{"scope required", apierrors.NewBadRequest(`scope is missing role "network" required by uniqueWithin (class "fabric")`), nil, CauseBadRequest},
		{"invalid", apierrors.NewInvalid(schema.GroupKind{Group: "ipam.miloapis.com", Kind: "IPClaim"}, name, nil), nil, CauseInvalid},
		{"pool exhausted", exhausted, ErrExhausted, ""},
		{"ipam: namespace missing", apierrors.NewForbidden(claimsGR, "", errors.New("namespace platform does not exist: an address bound into it would have nothing to collect it")), nil, CauseNamespaceMissing},
		{"kube: namespace missing", apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, ns), nil, CauseNamespaceMissing},
		{"namespace terminating", apierrors.NewForbidden(claimsGR, "", errors.New("unable to create new content in namespace platform because it is being terminated")), nil, CauseNamespaceTerminating},
		{"untenanted write", apierrors.NewForbidden(schema.GroupResource{Group: "ipam.miloapis.com"}, "", errors.New("writes must be scoped to a project: this request carries no iam.miloapis.com/parent-name extra, so it has no keyspace to write into.")), nil, CauseForbidden},
		{"RBAC", apierrors.NewForbidden(claimsGR, name, errors.New(`User "system:serviceaccount:galactic-system:galactic-hubctl" cannot create resource "ipclaims"`)), nil, CauseForbidden},
		{"plain 409", apierrors.NewConflict(claimsGR, name, errors.New(`an allocation under this identity already exists: IPAllocation "alloc-0", retained by an earlier claim of the same name; delete it to reuse the name`)), ErrConflict, ""},
		{"already exists", apierrors.NewAlreadyExists(claimsGR, name), ErrRefused, ""},
		{"server timeout", apierrors.NewServerTimeout(claimsGR, "create", 1), nil, ""},
	} {
		t.Run(tc.what, func(t *testing.T) {
			got := classifyCreate(tc.err)
			var config *ConfigError
			isConfig := errors.As(got, &config)
			switch {
			case tc.cause != "" && (!isConfig || config.Cause != tc.cause):
				t.Fatalf("classified %v, want a ConfigError of cause %s", got, tc.cause)
			case tc.cause == "" && isConfig:
				t.Fatalf("classified %v as configuration (%s)", got, config.Cause)
			case tc.want != nil && !errors.Is(got, tc.want):
				t.Fatalf("classified %v, want %v", got, tc.want)
			case tc.want == nil && tc.cause == "" && (errors.Is(got, ErrQuota) || errors.Is(got, ErrExhausted) || errors.Is(got, ErrConflict)):
				t.Fatalf("classified %v, want a transient error backed off as any", got)
			}
			if !strings.Contains(got.Error(), tc.err.Error()) {
				t.Fatalf("classified %q lost the server's message %q", got, tc.err)
			}
		})
	}
}

// Each refusal class is named once per network and cause (event, metric),
// retried slowly, and cleared when the claim is made.
func TestARefusedClaimIsNamedOncePerCause(t *testing.T) {
	s := newScene(t, 5)
	s.live("team", "a")
	api := &refusingCreates{addressService: s.svc, err: &ConfigError{Cause: CauseBadRequest, Err: errors.New("ipam: no default class for address family: IPv6")}}
	s.c = New(api, s.cache, nil, s.m, nil, s.config())
	for range 3 {
		if err := s.reconcile(t, "team", "a"); err == nil {
			t.Fatal("a refused claim reconciled")
		}
	}
	api.err = errors.Join(ErrExhausted, errors.New("ipam: pool cannot satisfy a /64"))
	_ = s.reconcile(t, "team", "a")
	_ = s.reconcile(t, "team", "a")
	if got := testutil.ToFloat64(s.m.refusals.WithLabelValues(RefusalConfiguration, CauseBadRequest)); got != 1 {
		t.Fatalf("configuration refusals = %v, want 1", got)
	}
	if got := testutil.ToFloat64(s.m.refusals.WithLabelValues(RefusalExhausted, RefusalExhausted)); got != 1 {
		t.Fatalf("exhausted refusals = %v, want 1", got)
	}
	misconfigured, exhausted := 0, 0
	for _, e := range s.svc.events {
		misconfigured += strings.Count(e, "FabricIdentityClaimMisconfigured")
		exhausted += strings.Count(e, "FabricIdentityPoolExhausted")
	}
	if misconfigured != 1 || exhausted != 1 {
		t.Fatalf("events %v: want one of each reason", s.svc.events)
	}
	if got := testutil.ToFloat64(s.m.refusedNets.WithLabelValues(RefusalExhausted)); got != 1 {
		t.Fatalf("networks refused as exhausted = %v, want 1", got)
	}
	api.err = nil
	if err := s.reconcile(t, "team", "a"); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(s.m.refusedNets.WithLabelValues(RefusalExhausted)); got != 0 {
		t.Fatalf("networks refused after the claim was made = %v, want 0", got)
	}
}

type refusingCreates struct {
	*addressService
	err error
}

func (r *refusingCreates) CreateClaim(ctx context.Context, c Claim) (Claim, error) {
	if r.err != nil {
		return Claim{}, r.err
	}
	return r.addressService.CreateClaim(ctx, c)
}

type fixedLease struct {
	l   RetentionLease
	err error
}

func (f fixedLease) RetentionLease() (RetentionLease, error) { return f.l, f.err }

// Guards the lease floor: with a retention lease shorter than the floor,
// or one that cannot be read, no claim is released (the hub says why, on
// a metric and an event); at or above the floor, claims are released.
func TestReleasesAreHeldWhileTheRetentionLeaseIsUnderTheFloor(t *testing.T) {
	for name, tc := range map[string]struct {
		lease    LeaseSource
		released bool
	}{
		"no lease":          {fixedLease{}, true},
		"lease under floor": {fixedLease{l: RetentionLease{Set: true, Lease: time.Hour, From: "class fabric"}}, false},
		"lease at floor":    {fixedLease{l: RetentionLease{Set: true, Lease: DefaultMinRetentionLease, From: "pool p"}}, true},
		"lease unreadable":  {fixedLease{err: errors.New("list ipclasses: connection refused")}, false},
	} {
		t.Run(name, func(t *testing.T) {
			s := newScene(t, 2)
			cfg := s.config()
			cfg.Leases, cfg.MinRetentionLease = tc.lease, DefaultMinRetentionLease
			s.c = New(s.svc, s.cache, nil, s.m, nil, cfg)
			s.live("team", "a")
			if err := s.reconcile(t, "team", "a"); err != nil {
				t.Fatal(err)
			}
			s.gone("team", "a")
			err := s.reconcile(t, "team", "a")
			_, kept := s.svc.claims[ClaimName("team", "a")]
			if kept == tc.released {
				t.Fatalf("claim kept %v (%v), want released %v", kept, err, tc.released)
			}
			held := testutil.ToFloat64(s.m.held)
			if (held == 1) == tc.released {
				t.Fatalf("releases_held = %v", held)
			}
			if !tc.released {
				if !errors.Is(err, ErrReleasesHeld) {
					t.Fatalf("reconcile = %v, want ErrReleasesHeld", err)
				}
				if !strings.Contains(strings.Join(s.svc.events, "\n"), "FabricIdentityReleasesHeld") {
					t.Fatalf("no FabricIdentityReleasesHeld event: %v", s.svc.events)
				}
				if st := s.c.Status(); st.ReleasesHeld == "" {
					t.Fatal("status says nothing of the hold")
				}
			}
		})
	}
}

func class(name, lease, parent string, dflt bool) unstructured.Unstructured {
	u := unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": name}, "spec": map[string]any{"ipFamily": "IPv6"}}}
	if lease != "" {
		_ = unstructured.SetNestedField(u.Object, lease, "spec", "retentionLease")
	}
	if parent != "" {
		_ = unstructured.SetNestedField(u.Object, parent, "spec", "parentClassName")
	}
	if dflt {
		u.SetAnnotations(map[string]string{AnnotationDefaultClass: "true"})
	}
	return u
}

func pool(name, maxLease string, classes ...any) unstructured.Unstructured {
	u := unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": name}, "spec": map[string]any{"classNames": classes}}}
	if maxLease != "" {
		_ = unstructured.SetNestedField(u.Object, maxLease, "spec", "maxRetentionLease")
	}
	return u
}

// The effective lease as ipam's EffectiveLease computes it
// (internal/allocator/lease.go): the lesser of the class's and its pool's,
// none when both are unset; over every pool that offers the class.
func TestTheEffectiveLeaseIsTheLesserOfClassAndPool(t *testing.T) {
	classes := []unstructured.Unstructured{class("fabric", "720h", "", true), class("child", "", "fabric", false), class("other", "1h", "", false)}
	pools := []unstructured.Unstructured{pool("a", "2000h", "fabric"), pool("b", "200h", "fabric"), pool("c", "1h", "other")}
	for _, tc := range []struct {
		class string
		want  time.Duration
		set   bool
	}{
		{"", 200 * time.Hour, true},       // the default class; pool b's cap is less
		{"fabric", 200 * time.Hour, true}, // named
		{"child", 200 * time.Hour, true},  // pools offer the chain's root
		{"other", time.Hour, true},
	} {
		got, err := EffectiveLease(classes, pools, tc.class)
		if err != nil || got.Set != tc.set || got.Lease != tc.want {
			t.Errorf("class %q: %+v %v, want %v", tc.class, got, err, tc.want)
		}
	}
	if got, err := EffectiveLease([]unstructured.Unstructured{class("plain", "", "", true)}, nil, ""); err != nil || got.Set {
		t.Errorf("no lease anywhere: %+v %v, want none", got, err)
	}
	if got, err := EffectiveLease(nil, nil, "fabric"); err == nil {
		t.Errorf("no class in view: %+v, want an error (the lease cannot be known)", got)
	}
	if _, err := EffectiveLease(classes, pools, "missing"); err == nil {
		t.Error("a class that does not exist gave a lease")
	}
}

// countedIdentities is an identity cache with a count, as the informer's.
type countedIdentities struct{ svcIdentities }

func (c countedIdentities) Len() int {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return len(c.s.identities)
}

// Guards the blind check: identities exist but no claim or allocation is
// in view (ipam's answer to an unscoped read is an empty list).
func TestAHubThatSeesIdentitiesButNoClaimsIsBlind(t *testing.T) {
	s := newScene(t, 2)
	cfg := s.config()
	cfg.Identities = countedIdentities{svcIdentities{s.svc}}
	s.c = New(s.svc, s.cache, nil, s.m, nil, cfg)
	if s.c.Blind() {
		t.Fatal("a hub with nothing at all is blind")
	}
	s.live("team", "a")
	if err := s.reconcile(t, "team", "a"); err != nil {
		t.Fatal(err)
	}
	if s.c.Blind() {
		t.Fatal("a hub that sees its claim is blind")
	}
	blindCfg := cfg
	blindCfg.Claims, blindCfg.Allocations = emptyClaims{}, emptyAllocations{}
	blind := New(s.svc, s.cache, nil, s.m, nil, blindCfg)
	if !blind.Blind() {
		t.Fatal("identities exist, no claim or allocation is in view, and the hub is not blind")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	blind.watchView(ctx)
	if testutil.ToFloat64(s.m.blind) != 1 || !strings.Contains(strings.Join(s.svc.events, "\n"), "FabricIdentityClaimsNotVisible") {
		t.Fatalf("blind: gauge %v, events %v", testutil.ToFloat64(s.m.blind), s.svc.events)
	}
}

type emptyClaims struct{}

func (emptyClaims) Get(string) (Claim, bool) { return Claim{}, false }
func (emptyClaims) List() []Claim            { return nil }

type emptyAllocations struct{}

func (emptyAllocations) Get(string) (Allocation, bool) { return Allocation{}, false }
func (emptyAllocations) List() []Allocation            { return nil }
