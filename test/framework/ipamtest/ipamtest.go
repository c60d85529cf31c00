// Package ipamtest is an address service shaped like milo-os/ipam
// (github.com/milo-os/ipam), for tests of code that claims addresses from
// it. It is a reverse proxy in front of a real kube-apiserver (the one
// test/framework/clustertest starts, where the IPClaim and IPAllocation CRDs of
// deploy/crds are installed) that carries out itself the requests ipam
// answers its own way, and forwards every other request unchanged:
//
//   - an IPClaim CREATE binds synchronously (201 with the claim Bound), and
//     meets a retained allocation of the same name the way one of three ipam
//     versions did (Retained);
//   - an IPClaim DELETE ignores its preconditions, publishes phase Releasing,
//     releases the allocation under its reclaimPolicy and answers the claim,
//     not a Status;
//   - a LIST ignores limit and continue;
//   - a request outside the platform project's prefix sees an empty keyspace
//     (LIST empty, GET 404, WATCH silent) and has its writes refused;
//   - Milo's quota admission refuses a create with 403 while the project
//     holds its limit, and gets a unit back only some time after a delete;
//   - Outage drops the watch events of an interval without a 410, as ipam's
//     watch did before a41cd6f1.
//
// Each behaviour cites the ipam file and function it copies, read at commit
// a41cd6f1250bc2f464f65814e339be1ea5c07146 unless it names 012be054826e or
// 05d511af749b.
//
// It is a test part and never ships: nothing under cmd/ may import it
// (TestNothingShippedImportsIt).
package ipamtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// Group is ipam's API group (pkg/apis/ipam/register.go GroupName).
const Group = "ipam.miloapis.com"

// claimsGR is what ipam names in the errors of an IPClaim request
// (v1alpha1.Resource("ipclaims")).
var claimsGR = schema.GroupResource{Group: Group, Resource: "ipclaims"}

// Retained is how a create meets a retained allocation of its name: an
// IPAllocation named hubctl.AllocationName(namespace, name) whose claimRef
// is empty because an earlier claim of that name was deleted under
// reclaimPolicy Retain.
type Retained int

const (
	// RetainedRebind: ipam at a41cd6f1 — a create whose name has a retained allocation (claimRef empty)
	// that fits re-binds it and answers 201 Bound with the same CIDR; one that does not fit (className or
	// prefixLength differ) is a plain 409 Conflict "ipam: retained allocation does not match this claim: ...".
	// (internal/registry/ipam/ipclaim/storage.go AllocatingREST.Create and reclaimRetained,
	// internal/allocator/reclaim.go ReclaimRetained and reclaimAgrees.)
	RetainedRebind Retained = iota
	// RetainedPlainConflict: ipam at 012be054 — 409 Conflict, no cause, message
	// `an allocation under this identity already exists: IPAllocation "alloc-…", retained by an earlier claim of the same name; delete it to reuse the name`.
	// (internal/registry/ipam/ipclaim/storage.go Create, isIdentityCollision and
	// retainedAllocationConflict at 012be054.)
	RetainedPlainConflict
	// RetainedCauseConflict: the seed's contract (pkg/ipamerrors.NewRetainedAllocation, which no ipam server path calls):
	// 409 Conflict with Details.Causes [{Type: "AllocationRetained", Message: <allocation name>, Field: <allocation name>}].
	RetainedCauseConflict
)

// String names the mode for test names and messages.
func (r Retained) String() string {
	switch r {
	case RetainedRebind:
		return "RetainedRebind"
	case RetainedPlainConflict:
		return "RetainedPlainConflict"
	case RetainedCauseConflict:
		return "RetainedCauseConflict"
	}
	return fmt.Sprintf("Retained(%d)", int(r))
}

// Options shape a Service.
type Options struct {
	// Retained picks the ipam version whose answer a create meets when its
	// name has a retained allocation.
	Retained Retained
	// Project: requests whose path starts with ProjectPrefix(Project) are scoped to the platform project
	// (the prefix is stripped before handling/forwarding). Other requests to /apis/ipam.miloapis.com/ are
	// untenanted: LIST answers an empty list (kind IPClaimList/IPAllocationList/..., with a resourceVersion),
	// WATCH stays open and sends no event (only the initial-events-end BOOKMARK a sendInitialEvents watch
	// asks for), GET answers 404 NotFound, POST/PUT/PATCH/DELETE answer ipam's untenanted 403
	// (Untenanted). Requests to other API groups pass through, scoped or not. Empty Project: every
	// request counts as scoped (no tenancy checks).
	Project string
	// QuotaLimit > 0: Milo's quota admission on IPClaim CREATE: while the platform project holds QuotaLimit
	// units, a create answers 403 Forbidden from apierrors.NewForbidden(ipclaims group resource, name,
	// errors.New(MiloQuotaDenied)) (MiloQuotaDeniedNewest, formatted with "ipclaims", when
	// NewestQuotaWording). A unit is taken by each claim created through the proxy and given back
	// QuotaReturnDelay AFTER the proxy deleted that claim (Milo's garbage collector removing the
	// ResourceClaim owned by the deleted IPClaim: asynchronous).
	QuotaLimit         int
	QuotaReturnDelay   time.Duration
	NewestQuotaWording bool
}

// ProjectPrefix is the path under which Milo's front gate serves a
// project's control plane.
func ProjectPrefix(project string) string {
	return "/apis/resourcemanager.miloapis.com/v1alpha1/projects/" + project + "/control-plane"
}

// Service is a running proxy. Its methods are safe for concurrent use.
type Service struct {
	opts     Options
	upstream *rest.Config
	admin    dynamic.Interface
	proxy    *httputil.ReverseProxy
	url      string
	ctx      context.Context // cancelled when the test ends
	cancel   context.CancelFunc
	srv      *http.Server
	stopOnce sync.Once
	wg       sync.WaitGroup // the quota returns still pending

	// writeMu serialises claim creates and deletes, as ipam's transactions
	// on one claim key would, so that the probe of an allocation and the
	// write that follows it see the same state.
	writeMu sync.Mutex
	// outageMu serialises Outage calls.
	outageMu sync.Mutex

	mu           sync.Mutex
	requests     map[string]int
	creates      int
	deletes      int
	beforeDelete func(namespace, name string)
	refuse       *metav1.Status
	intercept    func(Request, http.ResponseWriter) bool
	trace        []string
	// quota: units in use, and the claims created through the proxy whose
	// unit is not yet given back, by UID.
	quotaUsed   int
	quotaClaims map[string]bool
	// blocks: the next never-issued block number, and the numbers of blocks
	// released by a Delete-policy allocation, to be issued again first.
	nextBlock  uint32
	freeBlocks map[uint32]bool
	// watches of ipclaims and ipallocations open through the proxy, and the
	// outage holding new ones, if any.
	watches map[*trackedWatch]bool
	outage  *outage
	held    int
}

// Start starts the proxy in front of upstream; t.Cleanup stops it (and cancels its goroutines).
func Start(t testing.TB, upstream *rest.Config, opts Options) *Service {
	t.Helper()
	s, err := start(upstream, opts)
	if err != nil {
		t.Fatalf("start ipam proxy: %v", err)
	}
	t.Cleanup(s.stop)
	return s
}

func start(upstream *rest.Config, opts Options) (*Service, error) {
	admin, err := dynamic.NewForConfig(upstream)
	if err != nil {
		return nil, fmt.Errorf("admin client: %w", err)
	}
	transport, err := rest.TransportFor(upstream)
	if err != nil {
		return nil, fmt.Errorf("upstream transport: %w", err)
	}
	target, _, err := rest.DefaultServerUrlFor(upstream)
	if err != nil {
		return nil, fmt.Errorf("upstream address: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{
		opts: opts, upstream: upstream, admin: admin, ctx: ctx, cancel: cancel,
		url:      "http://" + ln.Addr().String(),
		requests: map[string]int{}, quotaClaims: map[string]bool{},
		nextBlock: 1, freeBlocks: map[uint32]bool{},
		watches: map[*trackedWatch]bool{},
	}
	quiet := log.New(io.Discard, "", 0)
	s.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			// The proxy's client has no credentials: the upstream's admin
			// ones, which the transport adds only where none is set, are
			// the service's own.
			pr.Out.Header.Del("Authorization")
		},
		Transport: transport,
		// Watches stream: every write is flushed at once.
		FlushInterval:  -1,
		ModifyResponse: s.modifyResponse,
		ErrorHandler:   s.proxyError,
		ErrorLog:       quiet,
	}
	s.srv = &http.Server{
		Handler:     http.HandlerFunc(s.serve),
		BaseContext: func(net.Listener) context.Context { return ctx },
		ErrorLog:    quiet,
	}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// stop ends every request in flight (watches included), then the server,
// then waits for the pending quota returns, which the cancel ends too.
func (s *Service) stop() {
	s.stopOnce.Do(func() {
		// Under mu, so that returnUnit either sees the cancel or has
		// added its goroutine to wg before Wait.
		s.mu.Lock()
		s.cancel()
		s.mu.Unlock()
		_ = s.srv.Close()
		s.wg.Wait()
	})
}

// URL is "http://127.0.0.1:PORT".
func (s *Service) URL() string { return s.url }

// Config returns a rest.Config for a client of the proxy: Host = URL() + ProjectPrefix(project) when
// project != "", else URL(); no credentials, no TLS (the proxy uses the upstream's admin credentials).
// Its rate limits are the upstream config's.
func (s *Service) Config(project string) *rest.Config {
	host := s.url
	if project != "" {
		host += ProjectPrefix(project)
	}
	return &rest.Config{Host: host, QPS: s.upstream.QPS, Burst: s.upstream.Burst}
}

// SetBeforeClaimDelete sets f to run inside the proxy's handling of a DELETE of an ipclaim, after the
// request arrived and before the proxy reads and deletes the claim (so a test can re-create objects in
// the window between a client's read and its delete). Test seam; set before use; called with the claim's
// namespace and name, outside the proxy's write lock, so f may call the proxy (a create, say).
func (s *Service) SetBeforeClaimDelete(f func(namespace, name string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.beforeDelete = f
}

// RefuseCreates makes every IPClaim CREATE answer st (a *metav1.Status, written as JSON with st.Code)
// until RefuseCreates(nil). It is checked before anything else a create does, quota included.
func (s *Service) RefuseCreates(st *metav1.Status) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st == nil {
		s.refuse = nil
		return
	}
	s.refuse = st.DeepCopy()
}

// Request is what Intercept is told of a request: its verb (GET LIST
// WATCH POST PUT PATCH DELETE DELETECOLLECTION), resource, namespace and
// name, as the API server's RequestInfo reads them.
type Request struct{ Verb, Resource, Namespace, Name string }

// Intercept runs f first on every request through the proxy (nil: none).
// When f answers the request itself (an injected error, say) it returns
// true and the request goes no further; f may also block, to hold a
// request as a slow or paused API server would, and then return false to
// let it through. Test seam, for faults the real API server cannot be made
// to produce on one resource alone.
func (s *Service) Intercept(f func(Request, http.ResponseWriter) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.intercept = f
}

// Trace is every write through the proxy so far, in the order they
// arrived, as "VERB resource namespace/name" ("DELETE
// clusterpropagationpolicies /cloud-fabric-identity-a-b" for a
// cluster-scoped object).
func (s *Service) Trace() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.trace...)
}

// Requests counts every request through the proxy by "VERB resource": "POST ipclaims", "DELETE
// ipclaims", "DELETECOLLECTION ipclaims", "GET ipclaims", "LIST networks", "WATCH ipclaims", "PUT
// ipclaims/status"; a request for no resource by method and path ("GET /version"). Scoped and
// untenanted requests count alike. It returns a copy.
func (s *Service) Requests() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.requests))
	for k, v := range s.requests {
		out[k] = v
	}
	return out
}

// Deletes counts the DELETEs of ipclaims the proxy carried out: the claims
// it deleted upstream after releasing their allocations.
func (s *Service) Deletes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deletes
}

// Creates counts the scoped IPClaim creates the proxy answered, whatever
// the answer.
func (s *Service) Creates() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.creates
}

// QuotaUsed is how many quota units the project holds now.
func (s *Service) QuotaUsed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.quotaUsed
}

// request is what the proxy reads off a request's path and query, like the
// API server's RequestInfo.
type request struct {
	group, version, namespace, resource, name, subresource string
	isResource                                             bool
	verb                                                   string // GET LIST WATCH POST PUT PATCH DELETE DELETECOLLECTION, else the method
}

func parseRequest(r *http.Request) request {
	var q request
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		q.version = parts[1]
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		q.group, q.version = parts[1], parts[2]
		parts = parts[3:]
	default:
		q.verb = r.Method
		return q
	}
	watchPath := false
	if len(parts) > 0 && parts[0] == "watch" {
		watchPath, parts = true, parts[1:]
	}
	if len(parts) >= 3 && parts[0] == "namespaces" {
		q.namespace, parts = parts[1], parts[2:]
	}
	if len(parts) == 0 || parts[0] == "" {
		q.verb = r.Method
		return q
	}
	q.isResource = true
	q.resource = parts[0]
	if len(parts) > 1 {
		q.name = parts[1]
	}
	if len(parts) > 2 {
		q.subresource = strings.Join(parts[2:], "/")
	}
	switch r.Method {
	case http.MethodGet:
		w, _ := strconv.ParseBool(r.URL.Query().Get("watch"))
		switch {
		case w || watchPath:
			q.verb = "WATCH"
		case q.name == "":
			q.verb = "LIST"
		default:
			q.verb = "GET"
		}
	case http.MethodDelete:
		q.verb = "DELETE"
		if q.name == "" {
			q.verb = "DELETECOLLECTION"
		}
	default:
		q.verb = r.Method
	}
	return q
}

func (q request) key(path string) string {
	if !q.isResource {
		return q.verb + " " + path
	}
	if q.subresource != "" {
		return q.verb + " " + q.resource + "/" + q.subresource
	}
	return q.verb + " " + q.resource
}

// serve routes a request: the project's prefix comes off a scoped one,
// ipam's own answers are given here, the rest goes upstream.
func (s *Service) serve(w http.ResponseWriter, r *http.Request) {
	scoped := true
	if s.opts.Project != "" {
		prefix := ProjectPrefix(s.opts.Project)
		tail, ok := strings.CutPrefix(r.URL.Path, prefix)
		if ok && (tail == "" || strings.HasPrefix(tail, "/")) {
			r.URL.Path = tail
			if r.URL.RawPath != "" {
				r.URL.RawPath = strings.TrimPrefix(r.URL.RawPath, prefix)
			}
		} else {
			scoped = false
		}
	}
	q := parseRequest(r)
	s.mu.Lock()
	s.requests[q.key(r.URL.Path)]++
	switch q.verb {
	case "POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION":
		if q.isResource && q.subresource == "" {
			s.trace = append(s.trace, q.verb+" "+q.resource+" "+q.namespace+"/"+q.name)
		}
	}
	intercept := s.intercept
	s.mu.Unlock()
	if intercept != nil && intercept(Request{Verb: q.verb, Resource: q.resource, Namespace: q.namespace, Name: q.name}, w) {
		return
	}

	if !q.isResource || q.group != Group {
		s.proxy.ServeHTTP(w, r)
		return
	}
	if !scoped {
		s.serveUntenanted(w, r, q)
		return
	}
	switch {
	case q.resource == "ipclaims" && q.verb == "POST" && q.name == "" && q.subresource == "":
		s.createClaim(w, r, q)
	case q.resource == "ipclaims" && q.verb == "DELETE" && q.subresource == "":
		s.deleteClaim(w, r, q)
	case q.resource == "ipclaims" && q.verb == "DELETECOLLECTION":
		s.deleteClaims(w, r, q)
	case q.verb == "LIST":
		// ipam's GetList ignores limit and continue
		// (internal/storage/postgres/store.go GetList, a41cd6f1: the query
		// has no LIMIT and no continue token), so every page is the whole
		// list.
		v := r.URL.Query()
		v.Del("limit")
		v.Del("continue")
		r.URL.RawQuery = v.Encode()
		s.proxy.ServeHTTP(w, r)
	case q.verb == "WATCH" && (q.resource == "ipclaims" || q.resource == "ipallocations"):
		s.watch(w, r, q)
	default:
		s.proxy.ServeHTTP(w, r)
	}
}

// proxyError answers a failed forward with a Status, except for a request
// whose context ended (the client went, or Outage cut a watch that had
// not started streaming): that one gets an empty answer, which a watch
// reads as its end.
func (s *Service) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return
	}
	st := apierrors.NewServiceUnavailable(fmt.Sprintf("ipamtest: forward %s %s: %v", r.Method, r.URL.Path, err)).ErrStatus
	st.Code = http.StatusBadGateway
	writeStatus(w, &st)
}

// writeStatus writes st as the API server would: a v1 Status with its
// code, which is 500 when st has none.
func writeStatus(w http.ResponseWriter, st *metav1.Status) {
	out := st.DeepCopy()
	out.Kind, out.APIVersion = "Status", "v1"
	if out.Status == "" {
		out.Status = metav1.StatusFailure
	}
	code := int(out.Code)
	if code == 0 {
		code = http.StatusInternalServerError
		out.Code = int32(code)
	}
	writeJSON(w, code, out)
}

// writeError writes err's Status when it carries one (an upstream answer,
// an ipam refusal), else a 500 as the API server renders a plain error.
func writeError(w http.ResponseWriter, err error) {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		st := status.Status()
		writeStatus(w, &st)
		return
	}
	st := apierrors.NewInternalError(err).ErrStatus
	writeStatus(w, &st)
}

func writeJSON(w http.ResponseWriter, code int, obj any) {
	b, err := json.Marshal(obj)
	if err != nil {
		http.Error(w, fmt.Sprintf("encode answer: %v", err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}
