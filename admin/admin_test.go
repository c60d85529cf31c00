package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/datum-cloud/galactic-node/admin"
	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/dropwatch"
	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/nodeview"
	"github.com/datum-cloud/galactic-node/node/reclaim"
	"github.com/datum-cloud/galactic-node/test/framework/syncbuf"
)

const (
	adminToken = "admin-0123456789abcdef"
	readToken  = "read-0123456789abcdef0"
)

// fakeBackend stands in for the node: these tests are of the HTTP, auth
// and input handling above it. The integration test serves the real node.
type fakeBackend struct {
	forces atomic.Int32
	calls  atomic.Int32 // Taps and Pending
	// realPasses counts ForcePass calls with dryRun false, dryPasses those
	// with it true.
	realPasses, dryPasses atomic.Int32
	// allowedMass counts ForcePass calls that release the brake.
	allowedMass atomic.Int32
	// touched counts calls of every Backend method, Ready included.
	touched atomic.Int32
	// pending, when set, is what Pending returns.
	pending atomic.Pointer[[]reclaim.Pending]
	// taps, when set, is what Taps returns.
	taps atomic.Pointer[[]nodeview.TapView]
	// notReady, when set, is what Ready returns.
	notReady atomic.Pointer[error]
	// drops serves the drop records the test feeds into dropFeed; nil:
	// the node has no drop monitor.
	drops    *dropwatch.Watch
	dropFeed *feedSource
	noDrops  atomic.Bool // the node has no drop monitor
}

func (f *fakeBackend) Ready(context.Context) error {
	f.touched.Add(1)
	if err := f.notReady.Load(); err != nil {
		return *err
	}
	return nil
}
func (f *fakeBackend) Status(ctx context.Context) nodeview.Status {
	st := nodeview.Status{Ready: true, Maps: []nodeview.MapFill{{Name: "tenant_policy", Rows: 1, MaxEntries: 65536}}}
	if err := f.Ready(ctx); err != nil {
		st.Ready, st.Reason = false, err.Error()
	}
	return st
}
func (f *fakeBackend) Taps(context.Context) ([]nodeview.TapView, error) {
	f.touched.Add(1)
	f.calls.Add(1)
	if t := f.taps.Load(); t != nil {
		return *t, nil
	}
	return []nodeview.TapView{{Name: "G000000010013H", Ifindex: 7, Identity: identity.Identity{VPC: 62, Attachment: 65}, VPC: "10", Attachment: "13", Owner: "sandbox-1", State: nodeview.StateCandidate}}, nil
}
func (f *fakeBackend) Pending() []reclaim.Pending {
	f.touched.Add(1)
	f.calls.Add(1)
	if p := f.pending.Load(); p != nil {
		return *p
	}
	return []reclaim.Pending{}
}
func (f *fakeBackend) ForcePass(_ context.Context, opts reclaim.PassOptions) reclaim.Report {
	f.touched.Add(1)
	f.forces.Add(1)
	dryRun := opts.DryRun
	if opts.AllowMassRemoval {
		f.allowedMass.Add(1)
	}
	if dryRun {
		f.dryPasses.Add(1)
	} else {
		f.realPasses.Add(1)
	}
	return reclaim.Report{Result: reclaim.ResultCompleted, DryRun: dryRun}
}
func (f *fakeBackend) Reports() []reclaim.Report { f.touched.Add(1); return nil }
func (f *fakeBackend) Maps(context.Context) ([]nodeview.MapView, error) {
	f.touched.Add(1)
	return []nodeview.MapView{{Layout: datapath.Layout{Name: "traffic_policy"}}}, nil
}
func (f *fakeBackend) MapRows(name string, _ uint32, _ int) ([]datapath.Row[any, any], error) {
	f.touched.Add(1)
	if name != "traffic_policy" {
		return nil, fmt.Errorf("map %q: %w", name, datapath.ErrUnknownMap)
	}
	return []datapath.Row[any, any]{}, nil
}
func (f *fakeBackend) InterfaceRows(ifindex uint32) (attachreg.InterfaceRows, error) {
	f.touched.Add(1)
	if ifindex != 7 {
		return attachreg.InterfaceRows{Ifindex: ifindex, Rows: map[string]any{}}, nil // none the datapath knows
	}
	return attachreg.InterfaceRows{Ifindex: ifindex, Rows: map[string]any{}, Attached: true}, nil
}

func (f *fakeBackend) RecentDrops(fl dropwatch.Filter) ([]dropwatch.Record, error) {
	f.touched.Add(1)
	f.calls.Add(1)
	if f.drops == nil || f.noDrops.Load() {
		return nil, nodeview.ErrNoDropMonitor
	}
	return f.drops.Recent(fl), nil
}
func (f *fakeBackend) FollowDrops(fl dropwatch.Filter) (*dropwatch.Follower, error) {
	f.touched.Add(1)
	f.calls.Add(1)
	if f.drops == nil || f.noDrops.Load() {
		return nil, nodeview.ErrNoDropMonitor
	}
	return f.drops.Follow(fl)
}

// feedSource is the drop records' Source of the fake node: the test sends
// what the datapath's ring buffer would yield.
type feedSource struct {
	c    chan dropwatch.Record
	done chan struct{}
}

func (s *feedSource) Next() (dropwatch.Record, error) {
	select {
	case r := <-s.c:
		return r, nil
	case <-s.done:
		return dropwatch.Record{}, dropwatch.ErrClosed
	}
}
func (s *feedSource) Close() error { return nil }

// watchDrops gives b a drop monitor fed by the test, stopped at cleanup.
func watchDrops(t testing.TB, b *fakeBackend, cfg dropwatch.Config) {
	b.dropFeed = &feedSource{c: make(chan dropwatch.Record), done: make(chan struct{})}
	cfg.Source = b.dropFeed
	w := dropwatch.New(cfg)
	b.drops = w
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { _ = w.Run(ctx); close(stopped) }()
	t.Cleanup(func() { cancel(); close(b.dropFeed.done); <-stopped })
}

type server struct {
	url     string
	backend *fakeBackend
	logs    *syncbuf.Buffer
	srv     *http.Server
}

func tokenFile(t testing.TB, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// start serves the admin API over real TCP on loopback.
func start(t *testing.T, cfg admin.Config) *server {
	t.Helper()
	s := &server{backend: &fakeBackend{}, logs: &syncbuf.Buffer{}}
	watchDrops(t, s.backend, dropwatch.Config{MaxFollowers: 2})
	if cfg.Tokens == nil && cfg.Kube == nil {
		tokens, err := admin.LoadTokenFile(tokenFile(t, "# operators\nadmin "+adminToken+"\n  # on-call\nread "+readToken+"\n"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Tokens = tokens
	}
	if cfg.ForcesPerMinute == 0 {
		cfg.ForcesPerMinute = 6 // the daemon's default; 0 would disable forcing
	}
	cfg.Log = slog.New(slog.NewJSONHandler(s.logs, nil))
	s.srv = admin.NewServer(admin.NewHandler(admin.BackendOf(s.backend), cfg), cfg.Log)
	s.srv.ReadHeaderTimeout = 300 * time.Millisecond
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.srv.Serve(l) }()
	t.Cleanup(func() { _ = s.srv.Close() })
	s.url = "http://" + l.Addr().String()
	return s
}

func (s *server) do(t *testing.T, method, path, token string, body io.Reader, hdr ...string) (*http.Response, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, s.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	if out == nil {
		out = map[string]any{"raw": string(b)}
	}
	return resp, out
}

var readRoutes = []string{"/v1/status", "/v1/taps", "/v1/taps/pending", "/v1/passes", "/v1/passes/last", "/v1/ebpf/maps", "/v1/ebpf/maps/traffic_policy", "/v1/ebpf/interfaces/7", "/v1/drops"}

func TestEveryRouteButHealthNeedsAToken(t *testing.T) {
	s := start(t, admin.Config{})
	for _, path := range readRoutes {
		for _, token := range []string{"", "wrong-token-0123456789"} {
			resp, body := s.do(t, "GET", path, token, nil)
			if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" || body["error"] == nil {
				t.Errorf("GET %s with token %q: %d %v, want 401 with WWW-Authenticate and an error", path, token, resp.StatusCode, body)
			}
		}
	}
	resp, _ := s.do(t, "POST", "/v1/passes", "", nil)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("POST /v1/passes without a token: %d", resp.StatusCode)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if resp, _ := s.do(t, "GET", path, "", nil); resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d, want 200 without a token", path, resp.StatusCode)
		}
	}
	if s.backend.calls.Load() != 0 || s.backend.forces.Load() != 0 {
		t.Fatal("an unauthenticated request reached the node")
	}
	for _, path := range readRoutes {
		if resp, body := s.do(t, "GET", path, readToken, nil); resp.StatusCode != http.StatusOK && path != "/v1/passes/last" {
			t.Errorf("GET %s with the read token: %d %v", path, resp.StatusCode, body)
		}
	}
}

func TestAReadTokenCannotForceAPass(t *testing.T) {
	s := start(t, admin.Config{})
	if resp, body := s.do(t, "POST", "/v1/passes", readToken, nil); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("POST with a read token: %d %v, want 403", resp.StatusCode, body)
	}
	if s.backend.forces.Load() != 0 {
		t.Fatal("a read token forced a pass")
	}
	if resp, body := s.do(t, "POST", "/v1/passes?dryRun=true", adminToken, nil); resp.StatusCode != http.StatusOK || body["result"] != "completed" {
		t.Fatalf("POST with the admin token: %d %v", resp.StatusCode, body)
	}
}

func TestATokenInTheURLIsRefused(t *testing.T) {
	s := start(t, admin.Config{})
	for _, path := range []string{"/v1/taps?access_token=" + adminToken, "/v1/taps?token=" + adminToken} {
		for _, header := range []string{"", adminToken} {
			if resp, _ := s.do(t, "GET", path, header, nil); resp.StatusCode != http.StatusBadRequest {
				t.Errorf("GET %s (header token %v): %d, want 400", path, header != "", resp.StatusCode)
			}
		}
	}
	if s.backend.calls.Load() != 0 {
		t.Fatal("a request with a token in the URL reached the node")
	}
}

func TestLogsNeverContainAToken(t *testing.T) {
	s := start(t, admin.Config{})
	s.do(t, "GET", "/v1/taps", adminToken, nil)
	s.do(t, "GET", "/v1/taps", readToken, nil)
	s.do(t, "POST", "/v1/passes", readToken, nil)
	s.do(t, "GET", "/v1/taps?access_token="+adminToken, "", nil)
	s.do(t, "GET", "/v1/taps", "not-a-token-but-secret-anyway", nil)
	logs := s.logs.String()
	if !strings.Contains(logs, "admin request") {
		t.Fatalf("no access log written: %q", logs)
	}
	for _, secret := range []string{adminToken, readToken, "not-a-token-but-secret-anyway"} {
		if strings.Contains(logs, secret) {
			t.Fatalf("the log contains a token:\n%s", logs)
		}
	}
}

func TestBadInputGetsAClearStatus(t *testing.T) {
	s := start(t, admin.Config{})
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/v1/ebpf/maps/no_such_map", http.StatusNotFound},
		{"GET", "/v1/ebpf/maps/traffic_policy?ifindex=abc", http.StatusBadRequest},
		{"GET", "/v1/ebpf/maps/traffic_policy?ifindex=0", http.StatusBadRequest},
		{"GET", "/v1/ebpf/maps/traffic_policy?ifindex=-1", http.StatusBadRequest},
		{"GET", "/v1/ebpf/maps/traffic_policy?limit=0", http.StatusBadRequest},
		{"GET", "/v1/ebpf/maps/traffic_policy?limit=10001", http.StatusBadRequest},
		{"GET", "/v1/ebpf/maps/traffic_policy?limit=ten", http.StatusBadRequest},
		{"GET", "/v1/ebpf/interfaces/abc", http.StatusBadRequest},
		{"GET", "/v1/ebpf/interfaces/0", http.StatusBadRequest},
		{"POST", "/v1/passes?dryRun=maybe", http.StatusBadRequest},
		{"DELETE", "/v1/taps", http.StatusMethodNotAllowed},
		{"GET", "/v1/nothing-here", http.StatusNotFound},
	} {
		resp, body := s.do(t, tc.method, tc.path, adminToken, nil)
		if resp.StatusCode != tc.want || body["error"] == nil {
			t.Errorf("%s %s: %d %v, want %d with an error", tc.method, tc.path, resp.StatusCode, body, tc.want)
		}
	}
	big := strings.Repeat("x", 64<<10)
	if resp, _ := s.do(t, "POST", "/v1/passes", adminToken, strings.NewReader(big)); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized body: %d, want 413", resp.StatusCode)
	}
	// Without a Content-Length (chunked), the limit applies while reading.
	if resp, _ := s.do(t, "POST", "/v1/passes", adminToken, io.MultiReader(strings.NewReader(big))); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized chunked body: %d, want 413", resp.StatusCode)
	}
	if s.backend.forces.Load() != 0 {
		t.Fatal("a refused request forced a pass")
	}
}

func TestAClientThatNeverFinishesItsHeadersIsCutOff(t *testing.T) {
	s := start(t, admin.Config{})
	c, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("GET /v1/taps HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadAll(c)
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the server kept a connection whose headers never finished")
	}
}

func TestForcesBeyondTheLimitGet429(t *testing.T) {
	s := start(t, admin.Config{ForcesPerMinute: 2})
	for i := range 2 {
		if resp, _ := s.do(t, "POST", "/v1/passes", adminToken, nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("force %d: %d", i+1, resp.StatusCode)
		}
	}
	resp, _ := s.do(t, "POST", "/v1/passes", adminToken, nil)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third force in a minute: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if n := s.backend.forces.Load(); n != 2 {
		t.Fatalf("%d passes forced, want 2", n)
	}
}

func TestAPersonGetsAnAlignedTable(t *testing.T) {
	s := start(t, admin.Config{})
	_, body := s.do(t, "GET", "/v1/taps", readToken, nil, "Accept", "text/plain")
	lines := strings.Split(strings.TrimSpace(body["raw"].(string)), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "NAME") || !strings.HasPrefix(lines[1], "G000000010013H") ||
		strings.Index(lines[0], "IFINDEX") != strings.Index(lines[1], "7 ") {
		t.Fatalf("text table:\n%s", body["raw"])
	}
	_, body = s.do(t, "GET", "/v1/taps", readToken, nil)
	if items, ok := body["items"].([]any); !ok || len(items) != 1 {
		t.Fatalf("JSON list: %v", body)
	}
}

func TestTheTokenFileIsReloadedWhenItChanges(t *testing.T) {
	path := tokenFile(t, "admin "+adminToken+"\n")
	tokens, err := admin.LoadTokenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go tokens.Watch(ctx, 20*time.Millisecond, slog.New(slog.DiscardHandler))
	s := start(t, admin.Config{Tokens: tokens})
	const rotated = "admin-rotated-0123456789"
	// Replaced by a rename, as a Secret volume updates: a rewrite in place
	// has an empty instant, which TestATruncateThenWriteRewriteRevokesNothing
	// covers look by look, and which a loaded machine can stretch over the
	// two looks this watcher takes 20 ms apart.
	replaceFile(t, path, "admin "+rotated+"\n")
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, _ := s.do(t, "GET", "/v1/taps", rotated, nil)
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the rotated token never worked")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if resp, _ := s.do(t, "GET", "/v1/taps", adminToken, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the old token after rotation: %d, want 401", resp.StatusCode)
	}
	// A broken file keeps the tokens in force.
	replaceFile(t, path, "superuser "+rotated+" extra\n")
	time.Sleep(100 * time.Millisecond)
	if resp, _ := s.do(t, "GET", "/v1/taps", rotated, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("after a malformed rewrite: %d, want the previous tokens kept", resp.StatusCode)
	}
}

// replaceFile puts content at path by a rename over it.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestAMalformedTokenFileNamesTheLineNotTheToken(t *testing.T) {
	for _, content := range []string{"root " + adminToken + "\n", "admin\n", "admin short\n", "read " + readToken + " extra\n"} {
		_, err := admin.LoadTokenFile(tokenFile(t, "# ok\n"+content))
		if err == nil || !strings.Contains(err.Error(), "line 2") || strings.Contains(err.Error(), adminToken) || strings.Contains(err.Error(), readToken) {
			t.Errorf("%q: %v", content, err)
		}
	}
}

// A misspelt dryRun must not be read as "no dryRun": it is refused, and no
// pass, dry or real, runs.
func TestAMisspeltDryRunRunsNoPass(t *testing.T) {
	s := start(t, admin.Config{})
	for _, query := range []string{"dryrun=true", "dry_run=true", "DryRun=true", "dryRun=true&dryrun=true", "dryRun=true&dryRun=false"} {
		resp, body := s.do(t, "POST", "/v1/passes?"+query, adminToken, nil)
		msg, _ := body["error"].(string)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(msg, "dryRun") {
			t.Errorf("POST /v1/passes?%s: %d %v, want 400 with an error naming dryRun", query, resp.StatusCode, body)
		}
	}
	if n, real := s.backend.forces.Load(), s.backend.realPasses.Load(); n != 0 {
		t.Fatalf("misspelt dryRun parameters ran %d passes, %d of them real", n, real)
	}
}

// routes is every route NewHandler serves, as a path to request it by and
// the query parameters it accepts; TestEveryRouteRefusesAnUnknownParameter
// fails when a route is missing from it.
var routes = []struct {
	method, pattern, path string
	accepts               []string
}{
	{"GET", "/healthz", "/healthz", nil},
	{"GET", "/readyz", "/readyz", nil},
	{"GET", "/v1/status", "/v1/status", nil},
	{"GET", "/v1/taps", "/v1/taps", []string{"state", "vpc"}},
	{"GET", "/v1/taps/pending", "/v1/taps/pending", nil},
	{"GET", "/v1/taps/{name}", "/v1/taps/G000000010013H", nil},
	{"GET", "/v1/passes", "/v1/passes", []string{"limit"}},
	{"GET", "/v1/passes/last", "/v1/passes/last", nil},
	{"GET", "/v1/ebpf/maps", "/v1/ebpf/maps", nil},
	{"GET", "/v1/ebpf/maps/{name}", "/v1/ebpf/maps/traffic_policy", []string{"ifindex", "limit"}},
	{"GET", "/v1/ebpf/interfaces/{ifindex}", "/v1/ebpf/interfaces/7", nil},
	{"GET", "/v1/drops", "/v1/drops", []string{"tap", "limit", "follow"}},
	{"POST", "/v1/passes", "/v1/passes", []string{"dryRun"}},
}

// TestEveryRouteRefusesAnUnknownParameter sends each route, with the admin
// token, a parameter it does not accept (and one it accepts but in another
// case, and a repeated one): each answers 400 naming the parameter and the
// accepted ones, and the node is not called.
func TestEveryRouteRefusesAnUnknownParameter(t *testing.T) {
	s := start(t, admin.Config{ForcesPerMinute: 1000})
	served := map[string]bool{}
	if err := chi.Walk(admin.NewHandler(admin.BackendOf(&fakeBackend{}), admin.Config{}).(chi.Routes), func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		served[method+" "+route] = true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, rt := range routes {
		delete(served, rt.method+" "+rt.pattern)
	}
	if len(served) > 0 {
		t.Fatalf("routes missing from the table: %v", served)
	}
	for _, rt := range routes {
		queries := []string{"bogus=1", "bogus", "=1", "verbose=true"}
		for _, a := range rt.accepts {
			for _, v := range []string{strings.ToLower(a), strings.ToUpper(a), "_" + a} {
				if v != a {
					queries = append(queries, v+"=1")
				}
			}
			queries = append(queries, a+"=1&"+a+"=1", a+"=1&bogus=1")
		}
		for _, query := range queries {
			for _, accept := range []string{"application/json", "text/plain"} {
				before := s.backend.touched.Load()
				resp, body := s.do(t, rt.method, rt.path+"?"+query, adminToken, nil, "Accept", accept)
				msg, _ := body["error"].(string)
				if accept == "text/plain" {
					msg, _ = body["raw"].(string)
					if !strings.HasPrefix(msg, "error: ") {
						t.Errorf("%s %s?%s as text: %q, want an error line", rt.method, rt.path, query, msg)
					}
				}
				name, _, _ := strings.Cut(strings.Split(query, "&")[len(strings.Split(query, "&"))-1], "=")
				if resp.StatusCode != http.StatusBadRequest || !strings.Contains(msg, fmt.Sprintf("%q", name)) {
					t.Errorf("%s %s?%s: %d %q, want 400 naming %q", rt.method, rt.path, query, resp.StatusCode, msg, name)
				}
				for _, a := range rt.accepts {
					if !strings.Contains(msg, fmt.Sprintf("%q", a)) {
						t.Errorf("%s %s?%s: %q does not list the accepted %q", rt.method, rt.path, query, msg, a)
					}
				}
				if s.backend.touched.Load() != before {
					t.Errorf("%s %s?%s (Accept %s) reached the node", rt.method, rt.path, query, accept)
				}
			}
		}
		// The parameters it accepts, each once, still work.
		query := ""
		for _, a := range rt.accepts {
			query += map[string]string{"ifindex": "ifindex=7&", "limit": "limit=5&", "dryRun": "dryRun=true&"}[a]
		}
		resp, body := s.do(t, rt.method, rt.path+"?"+strings.TrimSuffix(query, "&"), adminToken, nil)
		if resp.StatusCode >= 400 && rt.path != "/v1/passes/last" {
			t.Errorf("%s %s?%s: %d %v", rt.method, rt.path, query, resp.StatusCode, body)
		}
	}
	if n := s.backend.realPasses.Load(); n != 0 {
		t.Fatalf("%d real passes ran, want none", n)
	}
	if n := s.backend.dryPasses.Load(); n != 1 {
		t.Fatalf("%d dry passes ran, want the one with ?dryRun=true", n)
	}
}

// Authentication comes first: without a valid token an unknown parameter
// gets 401, a read token forcing gets 403, and a token in the URL still
// gets authorize's 400, whatever else the query holds.
func TestAuthIsCheckedBeforeParameters(t *testing.T) {
	s := start(t, admin.Config{})
	for _, tc := range []struct {
		method, path, token string
		want                int
		says                string
	}{
		{"POST", "/v1/passes?dryrun=true", "", http.StatusUnauthorized, "missing bearer token"},
		{"POST", "/v1/passes?dryrun=true", "wrong-token-0123456789", http.StatusUnauthorized, "invalid bearer token"},
		{"POST", "/v1/passes?dryrun=true", readToken, http.StatusForbidden, "needs an admin token"},
		{"GET", "/v1/taps?bogus=1", "", http.StatusUnauthorized, "missing bearer token"},
		{"GET", "/v1/ebpf/maps/traffic_policy?limit=5&limit=6", "", http.StatusUnauthorized, "missing bearer token"},
		{"GET", "/v1/taps?bogus=1&access_token=" + adminToken, "", http.StatusBadRequest, "Authorization header"},
		{"POST", "/v1/passes?dryRun=true&token=" + adminToken, adminToken, http.StatusBadRequest, "Authorization header"},
	} {
		resp, body := s.do(t, tc.method, tc.path, tc.token, nil)
		if msg, _ := body["error"].(string); resp.StatusCode != tc.want || !strings.Contains(msg, tc.says) {
			t.Errorf("%s %s (token %q): %d %v, want %d saying %q", tc.method, tc.path, tc.token, resp.StatusCode, body, tc.want, tc.says)
		}
	}
	if s.backend.touched.Load() != 0 {
		t.Fatal("a refused request reached the node")
	}
}

// A query string that does not parse is refused whole: url.ParseQuery
// would drop the bad pair and leave no dryRun, a real pass.
func TestAMalformedQueryRunsNoPass(t *testing.T) {
	s := start(t, admin.Config{})
	for _, query := range []string{"dryRun=tru%e", "dryRun=true;x=1", "dryRun%=true"} {
		if resp, body := s.do(t, "POST", "/v1/passes?"+query, adminToken, nil); resp.StatusCode != http.StatusBadRequest || body["error"] == nil {
			t.Errorf("POST /v1/passes?%s: %d %v, want 400", query, resp.StatusCode, body)
		}
	}
	if n := s.backend.forces.Load(); n != 0 {
		t.Fatalf("malformed queries ran %d passes", n)
	}
}

// TestPendingTapsShowWhenTheyAreEligible: the pending table has an ELIGIBLE
// column, the time from which a pass may confirm the candidate, or "now"
// once that has passed; JSON carries eligibleAt.
func TestPendingTapsShowWhenTheyAreEligible(t *testing.T) {
	s := start(t, admin.Config{})
	first := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	later := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	s.backend.pending.Store(&[]reclaim.Pending{
		{Tap: reclaim.TapRef{Name: "G000000010013H", Ifindex: 7, Owner: "sandbox-1"}, FirstSeen: first, EligibleAt: later, Passes: 1},
		{Tap: reclaim.TapRef{Name: "G000000010014H", Ifindex: 8, Owner: "sandbox-2"}, FirstSeen: first, EligibleAt: first.Add(30 * time.Second), Passes: 3},
	})
	_, body := s.do(t, "GET", "/v1/taps/pending", readToken, nil, "Accept", "text/plain")
	lines := strings.Split(strings.TrimSpace(body["raw"].(string)), "\n")
	if len(lines) != 3 {
		t.Fatalf("text table:\n%s", body["raw"])
	}
	col := strings.Index(lines[0], "ELIGIBLE")
	if col < 0 || strings.Index(lines[0], "PASSES") < col ||
		!strings.HasPrefix(lines[1][col:], later.Format(time.RFC3339)+" ") || !strings.HasPrefix(lines[2][col:], "now ") {
		t.Fatalf("ELIGIBLE column, want %s then now:\n%s", later.Format(time.RFC3339), body["raw"])
	}
	_, body = s.do(t, "GET", "/v1/taps/pending", readToken, nil)
	items, _ := body["items"].([]any)
	if len(items) != 2 || items[0].(map[string]any)["eligibleAt"] != later.Format(time.RFC3339) {
		t.Fatalf("JSON: %v", body)
	}
}
