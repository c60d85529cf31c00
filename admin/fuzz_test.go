package admin_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/datum-cloud/galactic-node/admin"
)

// FuzzAdminRequests sends arbitrary paths, query strings and bodies with a
// valid admin token through the handler: it must never panic, never answer
// 5xx for input the fake backend cannot fail on, and answer every error as
// JSON with a message.
func FuzzAdminRequests(f *testing.F) {
	for _, seed := range []string{"/v1/taps", "/v1/ebpf/maps/traffic_policy", "/v1/ebpf/interfaces/7", "/v1/passes"} {
		f.Add("GET", seed, "limit=5&ifindex=7", "")
	}
	f.Add("POST", "/v1/passes", "dryRun=true", "{}")
	f.Add("GET", "/v1/ebpf/maps/%00", "limit=-1", "")
	tokens, err := admin.LoadTokenFile(tokenFile(f, "admin "+adminToken+"\n"))
	if err != nil {
		f.Fatal(err)
	}
	h := admin.NewHandler(admin.BackendOf(&fakeBackend{}), admin.Config{Tokens: tokens, ForcesPerMinute: 1 << 30, Log: slog.New(slog.DiscardHandler)})
	f.Fuzz(func(t *testing.T, method, path, query, body string) {
		if method != "GET" && method != "POST" && method != "DELETE" {
			method = "GET"
		}
		u := &url.URL{Path: path, RawQuery: query}
		if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \r\n") {
			return
		}
		req, err := http.NewRequestWithContext(context.Background(), method, "http://node"+u.RequestURI(), strings.NewReader(body))
		if err != nil {
			return
		}
		req.Header.Set("Authorization", "Bearer "+adminToken)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		resp := w.Result()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 500 {
			t.Fatalf("%s %s?%s: %d %s", method, path, query, resp.StatusCode, b)
		}
		if resp.StatusCode >= 400 && !strings.Contains(string(b), `"error"`) {
			t.Fatalf("%s %s?%s: %d without a JSON error: %s", method, path, query, resp.StatusCode, b)
		}
	})
}
