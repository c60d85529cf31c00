package admin_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/datum-cloud/galactic-node/admin"
	"github.com/datum-cloud/galactic-node/internal/clustertest"
)

// TestDelegatedAuthFollowsRBAC runs TokenReview and SubjectAccessReview
// against a real API server: a service account that RBAC allows on
// nodes.galactic.datum.net reads and forces; one it does not gets 403; a
// token the server does not know gets 401.
func TestDelegatedAuthFollowsRBAC(t *testing.T) {
	cluster := clustertest.Shared(t)
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// A namespace of its own each run: a deleted one lingers while it
	// terminates.
	ns := fmt.Sprintf("galactic-admin-test-%d", time.Now().UnixNano()%1e9)
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}))
	t.Cleanup(func() {
		_ = cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
		_ = cs.RbacV1().ClusterRoles().Delete(ctx, "galactic-node-admin-test", metav1.DeleteOptions{})
		_ = cs.RbacV1().ClusterRoleBindings().Delete(ctx, "galactic-node-admin-test", metav1.DeleteOptions{})
	})
	for _, sa := range []string{"operator", "stranger"} {
		must(cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}))
	}
	must(cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "galactic-node-admin-test"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{admin.KubeAuthGroup}, Resources: []string{admin.KubeAuthResource}, Verbs: []string{"get", "create"}}},
	}, metav1.CreateOptions{}))
	must(cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "galactic-node-admin-test"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "galactic-node-admin-test"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "operator"}},
	}, metav1.CreateOptions{}))
	token := func(sa string) string {
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token for %s: %v", sa, err)
		}
		return tr.Status.Token
	}
	operator, stranger := token("operator"), token("stranger")

	s := start(t, admin.Config{Kube: admin.NewKubeAuth(cs, "node-a")})
	for _, tc := range []struct {
		method, path, token string
		want                int
	}{
		{"GET", "/v1/taps", operator, http.StatusOK},
		{"POST", "/v1/passes", operator, http.StatusOK},
		{"GET", "/v1/taps", stranger, http.StatusForbidden},
		{"POST", "/v1/passes", stranger, http.StatusForbidden},
		{"GET", "/v1/taps", "not-a-kubernetes-token-at-all", http.StatusUnauthorized},
	} {
		if resp, body := s.do(t, tc.method, tc.path, tc.token, nil); resp.StatusCode != tc.want {
			t.Errorf("%s %s: %d %v, want %d", tc.method, tc.path, resp.StatusCode, body, tc.want)
		}
	}
	if n := s.backend.forces.Load(); n != 1 {
		t.Fatalf("%d passes forced, want 1 (the operator's)", n)
	}
	for _, secret := range []string{operator, stranger} {
		if strings.Contains(s.logs.String(), secret) {
			t.Fatal("the log contains a service account token")
		}
	}
}

// TestAReviewTheAPIServerNeverAnswersEnds: the API server here accepts
// the TokenReview and never answers (an HTTPS server whose handler waits
// for the test to end, as a hung or partitioned API server does). The
// request ends with 503 once KubeAuth.Timeout has passed, instead of
// holding its connection for as long as the client waits.
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
	k := admin.NewKubeAuth(cs, "node-a")
	k.Timeout = 200 * time.Millisecond
	s := start(t, admin.Config{Kube: k})
	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("GET", s.url+"/v1/taps", nil)
		req.Header.Set("Authorization", "Bearer some-kubernetes-token-0123")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	select {
	case code := <-done:
		if code != http.StatusServiceUnavailable {
			t.Fatalf("a review never answered: %d, want 503", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the request still waits on the review after 30 s")
	}
}
