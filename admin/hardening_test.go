package admin_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/datum-cloud/galactic-node/admin"
	"github.com/datum-cloud/galactic-node/internal/metricsserve"
	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/nodeview"
	"github.com/datum-cloud/galactic-node/node/tun/holder"
	"github.com/datum-cloud/galactic-node/test/framework/syncbuf"
)

// TestTextTablesEscapeWhatOthersNamed serves taps whose holder name, owner
// stamp and name carry terminal escapes, a newline, a bidirectional
// override and bytes that are not UTF-8: the text table shows each escaped,
// one row per tap, and the JSON keeps the values exact.
func TestTextTablesEscapeWhatOthersNamed(t *testing.T) {
	s := start(t, admin.Config{})
	taps := []nodeview.TapView{{Name: "G000000010013H", Ifindex: 7, Identity: identity.Identity{VPC: 62, Attachment: 65},
		Owner: "sand\u202ebox\u009b", Holders: []holder.Holder{{PID: 42, Command: "\x1b[2J\nG0FAKE\r\xff\\"}}, State: nodeview.StateCandidate}}
	s.backend.taps.Store(&taps)
	_, body := s.do(t, "GET", "/v1/taps", readToken, nil, "Accept", "text/plain")
	raw := body["raw"].(string)
	if strings.ContainsAny(raw, "\x1b\r\u202e\u009b") || strings.Contains(raw, "\xff") {
		t.Fatalf("raw control characters in the table: %q", raw)
	}
	if lines := strings.Split(strings.TrimSuffix(raw, "\n"), "\n"); len(lines) != 2 {
		t.Fatalf("%d lines, want a header and one row: %q", len(lines), raw)
	}
	for _, want := range []string{`42/\x1b[2J\nG0FAKE\r\xff\\`, `sand\u202ebox\u009b`} {
		if !strings.Contains(raw, want) {
			t.Errorf("table lacks %s: %q", want, raw)
		}
	}
	resp, body := s.do(t, "GET", "/v1/taps", readToken, nil)
	items, _ := body["items"].([]any)
	if resp.StatusCode != http.StatusOK || len(items) != 1 || items[0].(map[string]any)["owner"] != "sand\u202ebox\u009b" {
		t.Fatalf("JSON: %d %v", resp.StatusCode, body)
	}
}

// TestFailedAuthenticationsSpendABudget: after FailedAuthBurst wrong
// tokens, wrong tokens get 429 with Retry-After; a valid token never does.
func TestFailedAuthenticationsSpendABudget(t *testing.T) {
	s := start(t, admin.Config{})
	codes := map[int]int{}
	for i := range admin.FailedAuthBurst + 10 {
		resp, _ := s.do(t, "GET", "/v1/taps", "wrong-token-0123456789-"+string(rune('a'+i%26)), nil)
		codes[resp.StatusCode]++
		if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
			t.Fatal("429 without Retry-After")
		}
	}
	// A refill of a unit or so may happen while the loop runs.
	if codes[http.StatusUnauthorized] < admin.FailedAuthBurst || codes[http.StatusUnauthorized] > admin.FailedAuthBurst+2 || codes[http.StatusTooManyRequests] < 8 {
		t.Fatalf("answers %v, want %d × 401 then 429", codes, admin.FailedAuthBurst)
	}
	if resp, _ := s.do(t, "GET", "/v1/taps", readToken, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("a valid token while the budget is spent: %d", resp.StatusCode)
	}
}

// TestStatusSaysWhyProbesDoNot: /readyz and /healthz say only "not ready"
// and "stuck", on the admin API as on the metrics port (one handler);
// /v1/status, behind a token, gives the reason.
func TestStatusSaysWhyProbesDoNot(t *testing.T) {
	stuck := errors.New("pass loop stuck: a pass has been in flight for 11m0s")
	s := start(t, admin.Config{Live: func(context.Context) error { return stuck }})
	why := errors.New("inventory: /secret/path/inventory.yaml: yaml: line 1")
	s.backend.notReady.Store(&why)
	resp, body := s.do(t, "GET", "/v1/status", readToken, nil)
	if resp.StatusCode != http.StatusOK || body["ready"] != false || body["reason"] != why.Error() {
		t.Errorf("/v1/status: %d %v", resp.StatusCode, body)
	}
	metrics := metricsserve.Handler(prometheus.NewRegistry(), func(context.Context) error { return stuck }, func(context.Context) error { return why })
	for name, h := range map[string]http.Handler{"admin": s.srv.Handler, "metrics": metrics} {
		for path, want := range map[string]string{"/readyz": "not ready\n", "/healthz": "stuck\n"} {
			rec := &recorder{header: http.Header{}}
			req, _ := http.NewRequest("GET", path, nil)
			h.ServeHTTP(rec, req)
			if rec.status != http.StatusServiceUnavailable || rec.body.String() != want {
				t.Errorf("%s %s: %d %q, want 503 %q", name, path, rec.status, rec.body.String(), want)
			}
		}
	}
}

type recorder struct {
	header http.Header
	status int
	body   strings.Builder
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}
func (r *recorder) WriteHeader(code int) { r.status = code }

// TestForcedPassesOffWithZero: ForcesPerMinute below 1 refuses every forced
// pass with 403 and runs none.
func TestForcedPassesOffWithZero(t *testing.T) {
	s := start(t, admin.Config{ForcesPerMinute: -1})
	if resp, body := s.do(t, "POST", "/v1/passes?dryRun=true", adminToken, nil); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("forcing with forces off: %d %v", resp.StatusCode, body)
	}
	if s.backend.forces.Load() != 0 {
		t.Fatal("a pass ran")
	}
}

// TestTheTokenFileIsReadStrictly: comments only at the start of a line, a
// file group or others may read (or a symlink to one) refused.
func TestTheTokenFileIsReadStrictly(t *testing.T) {
	const hashed = "0123456789abcdef#ghij"
	tokens, err := admin.LoadTokenFile(tokenFile(t, "# operators\n\t# on-call\nadmin "+hashed+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if tokens.Lookup(hashed[:16]) != admin.RoleNone || tokens.Lookup(hashed) != admin.RoleAdmin {
		t.Fatalf("prefix %v, whole %v: want none and admin", tokens.Lookup(hashed[:16]), tokens.Lookup(hashed))
	}
	if _, err := admin.LoadTokenFile(tokenFile(t, "admin "+adminToken+" # trailing\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("a trailing comment: %v, want an error naming line 1", err)
	}
	open := tokenFile(t, "admin "+adminToken+"\n")
	for _, mode := range []os.FileMode{0o640, 0o604, 0o620} {
		if err := os.Chmod(open, mode); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.LoadTokenFile(open); err == nil || !strings.Contains(err.Error(), "readable by group or others") {
			t.Errorf("mode %04o: %v, want refused", mode, err)
		}
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(open, link); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.LoadTokenFile(link); err == nil || !strings.Contains(err.Error(), "readable by group or others") {
		t.Errorf("a symlink to an open file: %v, want refused", err)
	}
}

// TestTokenFileChangesAreSeenByInodeAndContent: a same-size replacement
// with the old mtime is reloaded; deleting the file revokes every token,
// logged once; the file's return restores them.
func TestTokenFileChangesAreSeenByInodeAndContent(t *testing.T) {
	path := tokenFile(t, "admin "+adminToken+"\n")
	tokens, err := admin.LoadTokenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go tokens.Watch(ctx, 10*time.Millisecond, slogTo(logs))
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s never happened; log:\n%s", what, logs)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	const same = "admin-fedcba9876543210"
	fi, _ := os.Stat(path)
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte("admin "+same+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = os.Chtimes(tmp, fi.ModTime(), fi.ModTime())
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	waitFor("the same-size replacement loaded", func() bool {
		return tokens.Lookup(same) == admin.RoleAdmin && tokens.Lookup(adminToken) == admin.RoleNone
	})

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	waitFor("every token revoked", func() bool { return tokens.Lookup(same) == admin.RoleNone })
	time.Sleep(100 * time.Millisecond) // ten more looks
	if n := strings.Count(logs.String(), "every token from it is revoked"); n != 1 {
		t.Fatalf("revocation logged %d times, want once:\n%s", n, logs)
	}
	if err := os.WriteFile(path, []byte("admin "+same+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor("the tokens back with the file", func() bool { return tokens.Lookup(same) == admin.RoleAdmin })
}

func slogTo(w *syncbuf.Buffer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }
