package kubeauth_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/datum-cloud/galactic-node/admin"
	"github.com/datum-cloud/galactic-node/admin/kubeauth"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
)

func TestMain(m *testing.M) { os.Exit(clustertest.Main(m)) }

// budget counts what a Reviewer takes and gives back.
type budget struct {
	mu          sync.Mutex
	units       int
	taken, gave int
}

func (b *budget) Take(time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.units == 0 {
		return false
	}
	b.units--
	b.taken++
	return true
}

func (b *budget) Give() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.units++
	b.gave++
}

func (b *budget) counts() (units, taken, gave int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.units, b.taken, b.gave
}

// TestReviewsFollowRBAC runs TokenReview and SubjectAccessReview against a
// real API server: a service account that RBAC allows on
// nodes.galactic.datum.net may get and create; one allowed only on another
// node's name may not, here; one RBAC does not name may not; a token the
// server does not know is no user. Only the unknown token spends the budget
// for good.
func TestReviewsFollowRBAC(t *testing.T) {
	cluster := clustertest.Shared(t)
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// A namespace of its own each run: a deleted one lingers while it
	// terminates.
	ns := fmt.Sprintf("galactic-kubeauth-test-%d", time.Now().UnixNano()%1e9)
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}))
	t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}) })
	for _, sa := range []string{"operator", "node-b-operator", "stranger"} {
		must(cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}))
	}
	grant := func(sa string, names []string) {
		name := ns + "-" + sa
		must(cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{admin.KubeAuthGroup}, Resources: []string{admin.KubeAuthResource},
				ResourceNames: names, Verbs: []string{"get", "create"}}},
		}, metav1.CreateOptions{}))
		must(cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: sa}},
		}, metav1.CreateOptions{}))
		t.Cleanup(func() {
			_ = cs.RbacV1().ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{})
			_ = cs.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		})
	}
	grant("operator", nil)
	grant("node-b-operator", []string{"node-b"})
	token := func(sa string) string {
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token for %s: %v", sa, err)
		}
		return tr.Status.Token
	}
	operator, nodeB, stranger := token("operator"), token("node-b-operator"), token("stranger")
	user := func(sa string) string { return "system:serviceaccount:" + ns + ":" + sa }

	nodeA := kubeauth.New(cs, "node-a")
	b := &budget{units: 10}
	for _, tc := range []struct {
		name, token, verb string
		wantUser          string
		wantAllowed       bool
	}{
		{"operator reads", operator, "get", user("operator"), true},
		{"operator forces", operator, "create", user("operator"), true},
		{"another node's operator", nodeB, "get", user("node-b-operator"), false},
		{"stranger", stranger, "get", user("stranger"), false},
		{"unknown token", "not-a-kubernetes-token-at-all", "get", "", false},
	} {
		got, allowed, err := nodeA.Review(ctx, tc.token, tc.verb, b)
		if err != nil || got != tc.wantUser || allowed != tc.wantAllowed {
			t.Errorf("%s: Review = %q, %v, %v; want %q, %v", tc.name, got, allowed, err, tc.wantUser, tc.wantAllowed)
		}
	}
	// Four tokens asked about once each (the operator's second verb was
	// cached): the three that authenticated gave their unit back.
	if units, taken, gave := b.counts(); taken != 4 || gave != 3 || units != 9 {
		t.Errorf("budget: %d taken, %d given back, %d left; want 4, 3, 9", taken, gave, units)
	}
	if got, allowed, err := kubeauth.New(cs, "node-b").Review(ctx, nodeB, "get", nil); err != nil || got != user("node-b-operator") || !allowed {
		t.Errorf("node-b's operator on node-b: %q, %v, %v; want allowed", got, allowed, err)
	}

	// With the budget spent, what is cached is still answered and nothing
	// new is asked.
	empty := &budget{}
	if got, allowed, err := nodeA.Review(ctx, operator, "get", empty); err != nil || got != user("operator") || !allowed {
		t.Errorf("cached operator with no budget: %q, %v, %v; want allowed", got, allowed, err)
	}
	if _, _, err := nodeA.Review(ctx, "another-unknown-token", "get", empty); !errors.Is(err, admin.ErrNoBudget) {
		t.Errorf("a new token with no budget: %v, want ErrNoBudget", err)
	}
}

// TestAReviewTheAPIServerNeverAnswersEnds: the API server here accepts
// the TokenReview and never answers (an HTTPS server whose handler waits
// for the test to end, as a hung or partitioned API server does). Review
// fails once Reviewer.Timeout has passed, instead of holding its caller for
// as long as the client waits, and gives the unit back: the failure is not
// the caller's. With no budget it asks nothing, so it answers at once.
func TestAReviewTheAPIServerNeverAnswersEnds(t *testing.T) {
	hang := make(chan struct{})
	api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	defer api.Close()
	defer close(hang)
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	r := kubeauth.New(cs, "node-a")
	r.Timeout = 200 * time.Millisecond
	review := func(b admin.Budget) error {
		done := make(chan error, 1)
		go func() {
			_, _, err := r.Review(context.Background(), "some-kubernetes-token-0123", "get", b)
			done <- err
		}()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			t.Fatal("the review still waits after 30 s")
			return nil
		}
	}
	b := &budget{units: 1}
	if err := review(b); err == nil || errors.Is(err, admin.ErrNoBudget) {
		t.Fatalf("a review never answered: %v, want a token review error", err)
	}
	if units, taken, gave := b.counts(); units != 1 || taken != 1 || gave != 1 {
		t.Errorf("budget after an unanswered review: %d taken, %d given back, %d left; want 1, 1, 1", taken, gave, units)
	}
	if err := review(&budget{}); !errors.Is(err, admin.ErrNoBudget) {
		t.Fatalf("no budget: %v, want ErrNoBudget", err)
	}
}
