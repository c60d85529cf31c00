package admin_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/admin"
	"github.com/datum-cloud/galactic-node/node/reclaim"
)

// keptReports is a node that kept n reports, newest first, each saying its
// age in Reason so that a test can tell which were served.
type keptReports struct {
	*fakeBackend
	reports []reclaim.Report
}

func (k keptReports) Reports() []reclaim.Report { k.touched.Add(1); return k.reports }

func passesServer(t *testing.T, n int) (*httptest.Server, *fakeBackend) {
	t.Helper()
	tokens, err := admin.LoadTokenFile(tokenFile(t, "admin "+adminToken+"\nread "+readToken+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	fb := &fakeBackend{}
	k := keptReports{fakeBackend: fb}
	for i := range n {
		k.reports = append(k.reports, reclaim.Report{Result: reclaim.ResultCompleted, Reason: fmt.Sprintf("report %d", i),
			Started: time.Unix(1000-int64(i), 0), Finished: time.Unix(1000-int64(i), 0)})
	}
	b := admin.BackendOf(fb)
	b.Passes = k
	srv := httptest.NewServer(admin.NewHandler(b, admin.Config{Tokens: tokens}))
	t.Cleanup(srv.Close)
	return srv, fb
}

func getPasses(t *testing.T, srv *httptest.Server, query string) (int, []reclaim.Report, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", srv.URL+"/v1/passes"+query, nil)
	req.Header.Set("Authorization", "Bearer "+readToken)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out struct {
		Items []reclaim.Report `json:"items"`
		Error string           `json:"error"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("GET /v1/passes%s: %v: %s", query, err, body)
	}
	return resp.StatusCode, out.Items, out.Error
}

// GET /v1/passes serves the newest reports, DefaultPasses unless ?limit=
// asks for another count up to MaxPasses, so that its body is bounded
// however many reports the node keeps.
func TestPassesServesTheNewestReportsUpToALimit(t *testing.T) {
	srv, _ := passesServer(t, admin.MaxPasses)
	for _, c := range []struct {
		query string
		want  int
	}{
		{"", admin.DefaultPasses},
		{"?limit=1", 1},
		{"?limit=3", 3},
		{fmt.Sprintf("?limit=%d", admin.MaxPasses), admin.MaxPasses},
	} {
		code, items, msg := getPasses(t, srv, c.query)
		if code != http.StatusOK || len(items) != c.want {
			t.Errorf("GET /v1/passes%s: %d, %d reports (%s), want %d", c.query, code, len(items), msg, c.want)
			continue
		}
		for i, r := range items {
			if r.Reason != fmt.Sprintf("report %d", i) {
				t.Errorf("GET /v1/passes%s: report %d is %q, want the newest first", c.query, i, r.Reason)
			}
		}
	}

	// Fewer kept than asked: all of them.
	few, _ := passesServer(t, 2)
	if code, items, _ := getPasses(t, few, "?limit=5"); code != http.StatusOK || len(items) != 2 {
		t.Errorf("2 kept, limit 5: %d, %d reports", code, len(items))
	}
	none, _ := passesServer(t, 0)
	if code, items, _ := getPasses(t, none, ""); code != http.StatusOK || len(items) != 0 {
		t.Errorf("none kept: %d, %d reports", code, len(items))
	}
}

// A limit that is not a count from 1 to MaxPasses is refused with 400 that
// says what is wanted, before the node is asked.
func TestPassesRefusesABadLimit(t *testing.T) {
	srv, fb := passesServer(t, 4)
	for _, v := range []string{"0", "-1", "33", "1000000", "x", "1.5", "", " 3", "0x3", "99999999999999999999"} {
		before := fb.touched.Load()
		code, items, msg := getPasses(t, srv, "?limit="+url.QueryEscape(v))
		if v == "" {
			// An empty value is no value: the default, as every route reads it.
			if code != http.StatusOK || len(items) != 4 {
				t.Errorf("?limit=: %d, %d reports", code, len(items))
			}
			continue
		}
		if code != http.StatusBadRequest || !strings.Contains(msg, "limit") || !strings.Contains(msg, fmt.Sprintf("from 1 to %d", admin.MaxPasses)) {
			t.Errorf("?limit=%s: %d %q, want 400 saying the range", v, code, msg)
		}
		if fb.touched.Load() != before {
			t.Errorf("?limit=%s reached the node", v)
		}
	}
}
