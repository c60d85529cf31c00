// Package admin serves the node daemon's authenticated HTTP admin API:
// operators list taps and pending candidates, force a pass, and read eBPF
// rows. It knows HTTP and nothing of netlink; the node is a Backend. It also
// owns what every listener of the daemon is bounded by (listen.go): header
// size, connections and time.
//
// Every route but /healthz and /readyz needs a principal. On the unix
// socket, a caller who sends no token is who the kernel says it is
// (SO_PEERCRED): uid 0 is admin, members of the read group may read, anyone
// else is refused. Otherwise, and on TCP, "Authorization: Bearer <token>": a
// token from the token file (role read or admin), or, with delegated auth,
// one the API server authenticates and authorises. Tokens in
// the query string are refused; tokens are never logged. Failed
// authentications are rate-limited (429 beyond the budget). A query
// parameter a route does not read, or one it reads given twice, is refused
// with 400 and nothing done: ?dryrun=true must not run a real pass. The
// public probes say only whether the node is ready; why not is on GET
// /v1/status.
package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/internal/metricsserve"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/dropwatch"
	"github.com/datum-cloud/galactic-node/node/nodeview"
	"github.com/datum-cloud/galactic-node/node/reclaim"
)

// Health answers the probes and GET /v1/status.
type Health interface {
	Ready(ctx context.Context) error
	Status(ctx context.Context) nodeview.Status
}

// Taps answers GET /v1/taps and /v1/taps/pending.
type Taps interface {
	Taps(ctx context.Context) ([]nodeview.TapView, error)
	Pending() []reclaim.Pending
}

// Passes answers GET /v1/passes and runs POST /v1/passes.
type Passes interface {
	Reports() []reclaim.Report
	ForcePass(ctx context.Context, opts reclaim.PassOptions) reclaim.Report
}

// EBPF answers GET /v1/ebpf/...: the maps, their rows, one interface's rows.
type EBPF interface {
	Maps(ctx context.Context) ([]nodeview.MapView, error)
	MapRows(name string, ifindex uint32, limit int) ([]datapath.Row[any, any], error)
	InterfaceRows(ifindex uint32) (attachreg.InterfaceRows, error)
}

// Drops answers GET /v1/drops: sampled records of dropped frames, the
// newest kept or a live feed (node/dropwatch). Both fail when the node has
// no drop monitor (an older kernel's program, a ring buffer missing).
type Drops interface {
	RecentDrops(f dropwatch.Filter) ([]dropwatch.Record, error)
	FollowDrops(f dropwatch.Filter) (*dropwatch.Follower, error)
}

// Backend is the node as the admin API sees it, one part per concern, so
// that each route depends only on what it serves and a test may fake one
// concern alone. Every part is required.
type Backend struct {
	Health Health
	Taps   Taps
	Passes Passes
	EBPF   EBPF
	Drops  Drops
}

// BackendOf serves every concern from one value, as *nodeview.Views can.
func BackendOf(node interface {
	Health
	Taps
	Passes
	EBPF
	Drops
}) Backend {
	return Backend{Health: node, Taps: node, Passes: node, EBPF: node, Drops: node}
}

// Config configures the handler.
type Config struct {
	Tokens *TokenFile // may be nil
	Kube   Reviewer   // delegated auth (kubeauth.Reviewer); nil disables it
	// Peers admits unix-socket callers that send no token by their kernel
	// credentials (PeerContext must be the server's ConnContext); nil
	// admits none that way.
	Peers *PeerPolicy
	// Version and Node are shown by GET /v1/status.
	Version, Node string
	// Live is the liveness check /healthz answers with, the metrics port's
	// (internal/metricsserve); nil is always live.
	Live metricsserve.Probe
	// ForcesPerMinute bounds POST /v1/passes; beyond it callers get 429.
	// 0 (or less) disables forced passes: every POST /v1/passes gets 403.
	ForcesPerMinute int
	// MaxBodyBytes bounds request bodies (413 beyond). 0 means 4 KiB.
	MaxBodyBytes int64
	Log          *slog.Logger
}

// GET /v1/ebpf/maps/{name} serves DefaultRows rows unless ?limit= asks
// for up to MaxRows.
const (
	DefaultRows  = 100
	MaxRows      = 10000
	defaultLimit = DefaultRows
	maxLimit     = MaxRows
)

type handler struct {
	b      Backend
	cfg    Config
	log    *slog.Logger
	forces *window
	// failures is the budget of failed authentications: each one spends a
	// unit, and a token that would need a TokenReview or that no file holds
	// gets 429 while the budget is spent.
	failures *bucket
}

// Budget of failed authentications: FailedAuthBurst at once, then
// FailedAuthPerSecond. It bounds the TokenReviews that unknown tokens cost
// the API server, and the pace of guessing.
const (
	FailedAuthBurst     = 20
	FailedAuthPerSecond = 2
)

// NewHandler returns the admin API's routes. A Backend missing a part is a
// wiring mistake, and panics here rather than on the first request.
func NewHandler(b Backend, cfg Config) http.Handler {
	if b.Health == nil || b.Taps == nil || b.Passes == nil || b.EBPF == nil || b.Drops == nil {
		panic("admin: NewHandler needs every part of the Backend")
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 4 << 10
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	h := &handler{b: b, cfg: cfg, log: cfg.Log, forces: &window{limit: cfg.ForcesPerMinute, span: time.Minute},
		failures: newBucket(FailedAuthBurst, FailedAuthPerSecond, time.Now())}
	r := chi.NewRouter()
	r.Use(h.accessLog, h.limitBody)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) { writeError(w, r, http.StatusNotFound, "no such route") })
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, http.StatusMethodNotAllowed, r.Method+" is not allowed here")
	})
	// Every route names the query parameters it reads (accepts); any other
	// is refused before the handler runs. On /v1 the check follows
	// authorize, so an unauthenticated caller learns nothing of them.
	// The probes are the metrics port's, written once there.
	r.With(accepts()).Get("/healthz", metricsserve.Live(cfg.Live))
	r.With(accepts()).Get("/readyz", metricsserve.Ready(b.Health.Ready))
	r.Route("/v1", func(r chi.Router) {
		r.Group(func(r chi.Router) {
			r.Use(h.authorize(RoleRead, "get"))
			r.With(accepts()).Get("/status", h.status)
			r.With(accepts("state", "vpc")).Get("/taps", h.taps)
			r.With(accepts()).Get("/taps/pending", h.pending)
			r.With(accepts()).Get("/taps/{name}", h.tap)
			r.With(accepts("limit")).Get("/passes", h.passes)
			r.With(accepts()).Get("/passes/last", h.lastPass)
			r.With(accepts()).Get("/ebpf/maps", h.maps)
			r.With(accepts("ifindex", "limit")).Get("/ebpf/maps/{name}", h.mapRows)
			r.With(accepts()).Get("/ebpf/interfaces/{ifindex}", h.interfaceRows)
			r.With(accepts("tap", "limit", "follow")).Get("/drops", h.drops)
		})
		r.With(h.authorize(RoleAdmin, "create"), accepts("dryRun", "allowMassRemoval")).Post("/passes", h.force)
	})
	return r
}

// accepts refuses, with 400 and before next runs, a request whose query
// string is malformed, names a parameter other than names (matched
// case-sensitively: ?dryrun=true is not ?dryRun=true), or repeats one of
// names. A handler can then read its parameters with Query().Get knowing
// that an absent one was not misspelt, dropped or given twice.
func accepts(names ...string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if msg := checkQuery(r.URL.RawQuery, names); msg != "" {
				writeError(w, r, http.StatusBadRequest, msg)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// checkQuery says what is wrong with raw for a route that accepts names, or
// "" when nothing is.
func checkQuery(raw string, names []string) string {
	if raw == "" {
		return ""
	}
	// ParseQuery drops the pairs it cannot parse (a bad escape, a
	// semicolon) and returns the rest: a dropped ?dryRun=tru%e must not
	// read as no dryRun at all.
	q, err := url.ParseQuery(raw)
	if err != nil {
		return "malformed query string: " + err.Error()
	}
	accepted := "accepts no query parameters"
	if len(names) > 0 {
		quoted := make([]string, len(names))
		for i, n := range names {
			quoted[i] = strconv.Quote(n)
		}
		accepted = "accepts only " + strings.Join(quoted, ", ")
	}
	unknown := make([]string, 0, len(q))
	for k := range q {
		if !slices.Contains(names, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		var hint string
		for i, k := range unknown {
			for _, n := range names {
				if hint == "" && strings.EqualFold(strings.ReplaceAll(k, "_", ""), n) {
					hint = fmt.Sprintf(" (did you mean %q?)", n)
				}
			}
			unknown[i] = strconv.Quote(k)
		}
		plural := ""
		if len(unknown) > 1 {
			plural = "s"
		}
		return fmt.Sprintf("unknown query parameter%s %s: this route %s%s", plural, strings.Join(unknown, ", "), accepted, hint)
	}
	for _, n := range names {
		if len(q[n]) > 1 {
			return fmt.Sprintf("query parameter %q is given %d times: this route %s, each at most once", n, len(q[n]), accepted)
		}
	}
	return ""
}

type principalKey struct{}

// authorize admits callers whose token grants need (static tokens) or whose
// delegated review allows verb.
func (h *handler) authorize(need Role, verb string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			q := r.URL.Query()
			for _, k := range []string{"token", "access_token", "bearer", "auth"} {
				if q.Has(k) {
					writeError(w, r, http.StatusBadRequest, "tokens are accepted only in the Authorization header, never in the URL")
					return
				}
			}
			token, ok := bearer(r)
			if peer, onSocket := peerFrom(r.Context()); !ok && onSocket && h.cfg.Peers != nil {
				switch role := h.cfg.Peers.role(peer); {
				case role >= need:
					if p, ok := r.Context().Value(principalKey{}).(*string); ok {
						*p = peer.String() + ":" + role.String()
					}
					next.ServeHTTP(w, r)
				case role != RoleNone:
					writeError(w, r, http.StatusForbidden, fmt.Sprintf("%s may only read (through the admin socket's read group): %s needs root or an admin token", peer, needsAdmin(r)))
				default:
					writeError(w, r, http.StatusForbidden, fmt.Sprintf("%s is neither root nor in the admin socket's read group, and sent no token", peer))
				}
				return
			}
			if !ok {
				w.Header().Set("WWW-Authenticate", `Bearer realm="galactic-node"`)
				writeError(w, r, http.StatusUnauthorized, "missing bearer token")
				return
			}
			principal := ""
			switch role := h.cfg.Tokens.Lookup(token); {
			case role >= need:
				principal = "token:" + role.String()
			case role != RoleNone:
				writeError(w, r, http.StatusForbidden, fmt.Sprintf("a %s token may only read: %s needs an admin token", role, needsAdmin(r)))
				return
			case h.cfg.Kube != nil:
				user, allowed, err := h.cfg.Kube.Review(r.Context(), token, verb, h.failures)
				switch {
				case errors.Is(err, ErrNoBudget):
					tooManyFailures(w, r)
					return
				case err != nil:
					h.log.Warn("delegated auth failed", "error", err)
					writeError(w, r, http.StatusServiceUnavailable, "delegated authentication unavailable")
					return
				case user == "":
					unauthorized(w, r)
					return
				case !allowed:
					writeError(w, r, http.StatusForbidden, fmt.Sprintf("%s may not %s %s.%s", user, verb, KubeAuthResource, KubeAuthGroup))
					return
				}
				principal = "kube:" + user
			case !h.failures.Take(time.Now()):
				tooManyFailures(w, r)
				return
			default:
				unauthorized(w, r)
				return
			}
			if p, ok := r.Context().Value(principalKey{}).(*string); ok {
				*p = principal
			}
			next.ServeHTTP(w, r)
		})
	}
}

// needsAdmin names, for a refusal, what the caller tried in the words of
// the CLI that sends it, not the authorization verb the check used.
func needsAdmin(r *http.Request) string {
	if r.Method == http.MethodPost && r.URL.Path == "/v1/passes" {
		return "forcing a pass"
	}
	return r.Method + " " + r.URL.Path
}

func unauthorized(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="galactic-node"`)
	writeError(w, r, http.StatusUnauthorized, "invalid bearer token")
}

func tooManyFailures(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Retry-After", "1")
	writeError(w, r, http.StatusTooManyRequests, "too many failed authentications: retry later")
}

func bearer(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return "", false
	}
	return strings.TrimSpace(token), true
}

// accessLog logs each request: method, path (never the query, which a
// careless client may have put a token in), status, duration and who.
func (h *handler) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		principal := "anonymous"
		r = r.WithContext(context.WithValue(r.Context(), principalKey{}, &principal))
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		h.log.Info("admin request", "method", r.Method, "path", r.URL.Path, "status", sw.status,
			"duration", time.Since(start).Round(time.Microsecond), "principal", principal)
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection's writer: a
// streamed answer (GET /v1/drops?follow=true) flushes and sets deadlines.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (h *handler) limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > h.cfg.MaxBodyBytes {
			writeError(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("body larger than %d bytes", h.cfg.MaxBodyBytes))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes)
		next.ServeHTTP(w, r)
	})
}

// readyz answers anyone, so it says only ready or not: why not names
// files and internal errors, and is on /v1/status.
// Status is GET /v1/status: the daemon's version and node, readiness and,
// when not ready, why, the pass schedule, the last pass, the inventory's
// health and how full each map is.
type Status struct {
	Version string `json:"version"`
	Node    string `json:"node"`
	nodeview.Status
}

func (h *handler) status(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, r, http.StatusOK, Status{Version: h.cfg.Version, Node: h.cfg.Node, Status: h.b.Health.Status(r.Context())})
}

// tapStates are the states ?state= may name, most protected first.
var tapStates = []nodeview.TapState{nodeview.StateHeld, nodeview.StateLive, nodeview.StateUnstamped,
	nodeview.StateCandidate, nodeview.StateConfirmed, nodeview.StateStale}

// taps is GET /v1/taps: every tap, or with ?state= and ?vpc= only those
// in that state and VPC (base62, as the VPC column shows it).
func (h *handler) taps(w http.ResponseWriter, r *http.Request) {
	state, vpc := nodeview.TapState(r.URL.Query().Get("state")), r.URL.Query().Get("vpc")
	if state != "" && !slices.Contains(tapStates, state) {
		names := make([]string, len(tapStates))
		for i, s := range tapStates {
			names[i] = string(s)
		}
		writeError(w, r, http.StatusBadRequest, fmt.Sprintf("state %q: want one of %s", state, strings.Join(names, ", ")))
		return
	}
	taps, err := h.b.Taps.Taps(r.Context())
	if err != nil {
		writeError(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	taps = slices.DeleteFunc(taps, func(v nodeview.TapView) bool {
		return (state != "" && v.State != state) || (vpc != "" && v.VPC != vpc)
	})
	writeJSON(w, r, http.StatusOK, tapRows(taps))
}

// tap is GET /v1/taps/{name}: one tap, as kubectl get KIND NAME answers:
// the object itself as JSON, a one-row table as text, 404 when none.
func (h *handler) tap(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "name")
	taps, err := h.b.Taps.Taps(r.Context())
	if err != nil {
		writeError(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	i := slices.IndexFunc(taps, func(v nodeview.TapView) bool { return v.Name == name })
	if i < 0 {
		writeError(w, r, http.StatusNotFound, fmt.Sprintf("tap %q not found", name))
		return
	}
	if wantsText(r) {
		writeJSON(w, r, http.StatusOK, tapRows(taps[i:i+1]))
		return
	}
	writeJSON(w, r, http.StatusOK, taps[i])
}

func (h *handler) pending(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, r, http.StatusOK, pendingRows(h.b.Taps.Pending()))
}

// GET /v1/passes serves the newest reports only, DefaultPasses unless
// ?limit= asks for up to MaxPasses: a report is bounded (reclaim keeps no
// list of the cluster's objects in it), and the count bounds the body.
const (
	DefaultPasses = 8
	// MaxPasses is the reports the reclaim keeps (reclaim.Config.History's
	// default); a larger limit could return no more.
	MaxPasses = 32
)

func (h *handler) passes(w http.ResponseWriter, r *http.Request) {
	limit := DefaultPasses
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxPasses {
			writeError(w, r, http.StatusBadRequest, fmt.Sprintf("limit %q: want a number of reports from 1 to %d (default %d), newest first", v, MaxPasses, DefaultPasses))
			return
		}
		limit = n
	}
	reports := h.b.Passes.Reports()
	writeJSON(w, r, http.StatusOK, reportRows(reports[:min(limit, len(reports))]))
}

func (h *handler) lastPass(w http.ResponseWriter, r *http.Request) {
	// The last pass is the last finished one; /v1/passes lists the one
	// in flight too.
	reports := slices.DeleteFunc(h.b.Passes.Reports(), func(rep reclaim.Report) bool { return rep.Result == reclaim.ResultRunning })
	if len(reports) == 0 {
		writeError(w, r, http.StatusNotFound, "no pass has run yet")
		return
	}
	writeJSON(w, r, http.StatusOK, reports[0])
}

func (h *handler) force(w http.ResponseWriter, r *http.Request) {
	if h.cfg.ForcesPerMinute <= 0 {
		writeError(w, r, http.StatusForbidden, "forced passes are disabled on this node (--admin-forces-per-minute 0)")
		return
	}
	var opts reclaim.PassOptions
	for name, to := range map[string]*bool{"dryRun": &opts.DryRun, "allowMassRemoval": &opts.AllowMassRemoval} {
		if v := r.URL.Query().Get(name); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				writeError(w, r, http.StatusBadRequest, name+" must be true or false")
				return
			}
			*to = b
		}
	}
	// The body is optional and ignored, but read so that an oversized one
	// is refused rather than silently dropped.
	if _, err := readAll(r); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("body larger than %d bytes", tooLarge.Limit))
			return
		}
		writeError(w, r, http.StatusBadRequest, "unreadable body")
		return
	}
	if retry, ok := h.forces.allow(time.Now()); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(retry.Seconds())+1))
		writeError(w, r, http.StatusTooManyRequests, fmt.Sprintf("more than %d forced passes a minute", h.cfg.ForcesPerMinute))
		return
	}
	// Releasing the brake is an operator's decision about many tenants'
	// taps: it is logged at warn (the access log names the principal).
	if opts.AllowMassRemoval {
		h.log.Warn("pass forced with mass removal allowed", "dry_run", opts.DryRun)
	} else {
		h.log.Info("pass forced", "dry_run", opts.DryRun)
	}
	writeJSON(w, r, http.StatusOK, h.b.Passes.ForcePass(r.Context(), opts))
}

func (h *handler) maps(w http.ResponseWriter, r *http.Request) {
	maps, err := h.b.EBPF.Maps(r.Context())
	if err != nil {
		writeError(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, r, http.StatusOK, mapRows(maps))
}

func (h *handler) mapRows(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var ifindex uint32
	if v := q.Get("ifindex"); v != "" {
		n, err := parseIfindex(v)
		if err != nil {
			writeError(w, r, http.StatusBadRequest, err.Error())
			return
		}
		ifindex = n
	}
	limit := defaultLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxLimit {
			writeError(w, r, http.StatusBadRequest, fmt.Sprintf("limit must be a number from 1 to %d", maxLimit))
			return
		}
		limit = n
	}
	rows, err := h.b.EBPF.MapRows(chi.URLParam(r, "name"), ifindex, limit)
	switch {
	case errors.Is(err, datapath.ErrUnknownMap):
		writeError(w, r, http.StatusNotFound, h.unknownMap(r, err))
	case errors.Is(err, nodeview.ErrNotKeyedByInterface):
		writeError(w, r, http.StatusBadRequest, err.Error())
	case err != nil:
		writeError(w, r, http.StatusInternalServerError, err.Error())
	default:
		writeJSON(w, r, http.StatusOK, rowRows(rows))
	}
}

// unknownMap says err, a map not found, with the names of the maps there
// are, as the operator who misspelt one needs next.
func (h *handler) unknownMap(r *http.Request, err error) string {
	maps, lerr := h.b.EBPF.Maps(r.Context())
	if lerr != nil || len(maps) == 0 {
		return err.Error()
	}
	names := make([]string, len(maps))
	for i, m := range maps {
		names[i] = m.Name
	}
	return fmt.Sprintf("%v; the maps are %s", err, strings.Join(names, ", "))
}

func (h *handler) interfaceRows(w http.ResponseWriter, r *http.Request) {
	ifindex, err := parseIfindex(chi.URLParam(r, "ifindex"))
	if err != nil {
		writeError(w, r, http.StatusBadRequest, err.Error())
		return
	}
	rows, err := h.b.EBPF.InterfaceRows(ifindex)
	if err != nil {
		writeError(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	// An interface with no program and no row is none the datapath knows
	// (most often no interface at all): NotFound, as kubectl says of a
	// name it cannot find, rather than an empty answer that reads as fine.
	if !rows.Attached && len(rows.Rows) == 0 {
		writeError(w, r, http.StatusNotFound, fmt.Sprintf("interface %d not found: no program is attached to it and no map has a row of it (galactic-node taps lists the tenant taps)", ifindex))
		return
	}
	writeJSON(w, r, http.StatusOK, rows)
}

func parseIfindex(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("ifindex %q: want a positive number", s)
	}
	return uint32(n), nil
}

// window is a sliding-window rate limit.
type window struct {
	mu    sync.Mutex
	limit int
	span  time.Duration
	times []time.Time
}

func (w *window) allow(now time.Time) (retryAfter time.Duration, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	cut := 0
	for cut < len(w.times) && now.Sub(w.times[cut]) >= w.span {
		cut++
	}
	w.times = w.times[cut:]
	if len(w.times) >= w.limit {
		return w.span - now.Sub(w.times[0]), false
	}
	w.times = append(w.times, now)
	return 0, true
}

// ErrNoBudget is what a Reviewer returns instead of asking while the
// budget of failed authentications is spent.
var ErrNoBudget = errors.New("too many failed authentications")

// Group and resource of the virtual resource that a Reviewer asks about:
// read routes need "get", forcing a pass needs "create". RBAC rules that
// let an operator in name them.
const (
	KubeAuthGroup    = "galactic.datum.net"
	KubeAuthResource = "nodes"
)

// Reviewer judges a bearer token that no token file holds by asking an
// authority outside the node: kubeauth.Reviewer asks the API server.
type Reviewer interface {
	// Review authenticates token and asks whether its user may verb this
	// node's KubeAuthResource. user is empty when the token did not
	// authenticate. A review it cannot answer from what it already knows
	// first takes a unit of budget (nil: no budget), and gives it back when
	// the token authenticates; with none left it asks nothing and returns
	// ErrNoBudget.
	Review(ctx context.Context, token, verb string, budget Budget) (user string, allowed bool, err error)
}

// Budget is the handler's budget of failed authentications, which a
// Reviewer spends on the tokens it must ask about.
type Budget interface {
	// Take spends a unit if one is left.
	Take(now time.Time) bool
	// Give returns a unit spent on what turned out not to be a failure.
	Give()
}

// bucket is a token bucket: up to burst units, refilled at perSecond.
type bucket struct {
	mu        sync.Mutex
	burst     float64
	perSecond float64
	units     float64
	at        time.Time
}

func newBucket(burst, perSecond int, now time.Time) *bucket {
	return &bucket{burst: float64(burst), perSecond: float64(perSecond), units: float64(burst), at: now}
}

// Take spends a unit if one is left.
func (b *bucket) Take(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.After(b.at) {
		b.units = min(b.burst, b.units+now.Sub(b.at).Seconds()*b.perSecond)
		b.at = now
	}
	if b.units < 1 {
		return false
	}
	b.units--
	return true
}

// Give returns a unit spent on what turned out not to be a failure.
func (b *bucket) Give() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.units = min(b.burst, b.units+1)
}

func writeError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	writeJSON(w, r, status, errorBody{Error: msg})
}

type errorBody struct {
	Error string `json:"error"`
}

func writeJSON(w http.ResponseWriter, r *http.Request, status int, v any) {
	if wantsText(r) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(status)
		writeText(w, v)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	_ = enc.Encode(withEmptyLists(v))
	// curl prints JSON to a terminal too.
	_, _ = w.Write(escapeJSON(buf.Bytes()))
}

func wantsText(r *http.Request) bool {
	accept := r.Header.Get("Accept")
	return strings.Contains(accept, "text/plain") && !strings.Contains(accept, "application/json")
}
