package admin_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/datum-cloud/galactic-node/admin"
)

// fakeReviewer answers from a table: a unit test of how the handler acts
// on a Reviewer's answers. kubeauth's tests ask a real API server, and the
// integration tests run the daemon with both.
type fakeReviewer struct {
	mu      sync.Mutex
	answers map[string]review // by token
	asked   []string          // verbs, in order
}

type review struct {
	user    string
	allowed bool
	err     error
}

func (f *fakeReviewer) Review(_ context.Context, token, verb string, budget admin.Budget) (string, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, verb)
	if budget == nil {
		return "", false, errors.New("the handler passed no budget")
	}
	a := f.answers[token]
	return a.user, a.allowed, a.err
}

// TestDelegatedAnswersBecomeStatuses: what the Reviewer says decides the
// answer: allowed serves, a user not allowed is 403 naming them, no user
// is 401, a failed review is 503 and an empty budget 429. Read routes ask
// for "get", forcing a pass for "create"; a token file's token is never
// sent to the Reviewer, and no token reaches the log.
func TestDelegatedAnswersBecomeStatuses(t *testing.T) {
	const (
		allowedToken  = "kube-allowed-0123456789"
		deniedToken   = "kube-denied-0123456789"
		unknownToken  = "kube-unknown-0123456789"
		failingToken  = "kube-failing-0123456789"
		noBudgetToken = "kube-nobudget-0123456789"
	)
	r := &fakeReviewer{answers: map[string]review{
		allowedToken:  {user: "system:serviceaccount:ops:operator", allowed: true},
		deniedToken:   {user: "system:serviceaccount:ops:stranger"},
		unknownToken:  {},
		failingToken:  {err: errors.New("token review: connection refused")},
		noBudgetToken: {err: admin.ErrNoBudget},
	}}
	tokens, err := admin.LoadTokenFile(tokenFile(t, "read "+readToken+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	s := start(t, admin.Config{Tokens: tokens, Kube: r})
	for _, tc := range []struct {
		method, path, token string
		want                int
		wantVerb            string
	}{
		{"GET", "/v1/taps", allowedToken, http.StatusOK, "get"},
		{"POST", "/v1/passes", allowedToken, http.StatusOK, "create"},
		{"GET", "/v1/taps", deniedToken, http.StatusForbidden, "get"},
		{"GET", "/v1/taps", unknownToken, http.StatusUnauthorized, "get"},
		{"GET", "/v1/taps", failingToken, http.StatusServiceUnavailable, "get"},
		{"GET", "/v1/taps", noBudgetToken, http.StatusTooManyRequests, "get"},
		{"GET", "/v1/taps", readToken, http.StatusOK, ""},
	} {
		r.mu.Lock()
		r.asked = nil
		r.mu.Unlock()
		resp, body := s.do(t, tc.method, tc.path, tc.token, nil)
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s with %s: %d %v, want %d", tc.method, tc.path, tc.token, resp.StatusCode, body, tc.want)
		}
		r.mu.Lock()
		asked := strings.Join(r.asked, ",")
		r.mu.Unlock()
		if asked != tc.wantVerb {
			t.Errorf("%s %s with %s: the reviewer was asked %q, want %q", tc.method, tc.path, tc.token, asked, tc.wantVerb)
		}
		if msg, _ := body["error"].(string); tc.want == http.StatusForbidden && !strings.Contains(msg, "stranger") {
			t.Errorf("403 does not name the user: %v", body)
		}
		if tc.want == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
			t.Error("429 without Retry-After")
		}
	}
	if n := s.backend.forces.Load(); n != 1 {
		t.Errorf("%d passes forced, want 1 (the allowed user's)", n)
	}
	for _, secret := range []string{allowedToken, deniedToken, unknownToken, failingToken, noBudgetToken, readToken} {
		if strings.Contains(s.logs.String(), secret) {
			t.Fatalf("the log contains the token %s", secret)
		}
	}
}
