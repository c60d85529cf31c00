package ipamtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/datum-cloud/galactic-node/hubctl"
)

// trackedWatch is a watch of ipclaims or ipallocations being forwarded;
// cancel ends it.
type trackedWatch struct{ cancel context.CancelFunc }

// outage holds the watches that arrive while Outage's during runs; done is
// closed when they may go on, rv (set before) being where they resume.
type outage struct {
	done chan struct{}
	rv   uint64
}

// cutKey marks the context of a tracked watch's forward, so that
// modifyResponse makes its body end cleanly when the watch is cut.
type cutKey struct{}

// Outage models ipam's watch before a41cd6f1 (internal/watch/postgres.go seedCursorFromRV at 05d511af: no 410
// for a resourceVersion older than the 5-minute changelog): it ends every open watch of ipclaims and
// ipallocations, holds every new such watch while during runs, then lets them resume — each watch whose
// resourceVersion is older than the upstream's current one when during returned is rewritten to start at that
// current resourceVersion, so the events in between (e.g. a claim deleted inside during) are never delivered
// and no 410 is sent. Watches started later are unaffected.
//
// An ended watch ends cleanly (its stream closes as a server's timeout
// closes it), so an informer resumes from the last resourceVersion it saw
// rather than listing again. A client-go reflector treats a watch that
// lasted under a second with no event as an error and lists again, so a
// test should let its informer's watch run for a second, or see an
// event, before the outage. HeldWatches tells during when the resumed
// watches have arrived.
func (s *Service) Outage(during func()) {
	s.outageMu.Lock()
	defer s.outageMu.Unlock()
	o := &outage{done: make(chan struct{})}
	s.mu.Lock()
	s.outage = o
	for w := range s.watches {
		w.cancel()
	}
	s.mu.Unlock()
	defer func() {
		// Released even when during panics (a t.Fatal in it).
		s.mu.Lock()
		s.outage = nil
		s.mu.Unlock()
		close(o.done)
	}()
	during()
	if rv, err := s.currentRV(s.ctx); err == nil {
		o.rv = rv
	}
}

// HeldWatches is how many watches an Outage holds now.
func (s *Service) HeldWatches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

// currentRV is the upstream's resourceVersion now: that of a quorum LIST,
// which is the store's latest revision, whatever the resource.
func (s *Service) currentRV(ctx context.Context) (uint64, error) {
	list, err := s.admin.Resource(hubctl.ClaimResource).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return 0, fmt.Errorf("read the current resourceVersion: %w", err)
	}
	rv, err := strconv.ParseUint(list.GetResourceVersion(), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read the current resourceVersion %q: %w", list.GetResourceVersion(), err)
	}
	return rv, nil
}

// watch forwards a watch of ipclaims or ipallocations, held while an
// Outage runs and tracked so that one can end it.
func (s *Service) watch(w http.ResponseWriter, r *http.Request, _ request) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	tw := &trackedWatch{cancel: cancel}
	for {
		s.mu.Lock()
		o := s.outage
		if o == nil {
			s.watches[tw] = true
			s.mu.Unlock()
			break
		}
		s.held++
		s.mu.Unlock()
		select {
		case <-o.done:
		case <-ctx.Done():
		}
		s.mu.Lock()
		s.held--
		s.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		v := r.URL.Query()
		if rv, err := strconv.ParseUint(v.Get("resourceVersion"), 10, 64); err == nil && rv > 0 && rv < o.rv {
			v.Set("resourceVersion", strconv.FormatUint(o.rv, 10))
			r.URL.RawQuery = v.Encode()
		}
	}
	defer func() {
		s.mu.Lock()
		delete(s.watches, tw)
		s.mu.Unlock()
	}()
	s.proxy.ServeHTTP(w, r.WithContext(context.WithValue(ctx, cutKey{}, true)))
}

// modifyResponse makes the body of a tracked watch end with io.EOF when
// its context is cancelled, so that the proxy finishes the response as a
// clean end of stream instead of aborting the connection.
func (s *Service) modifyResponse(res *http.Response) error {
	if ctx := res.Request.Context(); ctx.Value(cutKey{}) != nil {
		res.Body = &cutBody{ReadCloser: res.Body, ctx: ctx}
	}
	return nil
}

type cutBody struct {
	io.ReadCloser
	ctx context.Context
}

func (b *cutBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && b.ctx.Err() != nil {
		return n, io.EOF
	}
	return n, err
}

// serveUntenanted answers a request to ipam that carries no project.
// Reads see the unprefixed keyspace, which is never written
// (internal/storage/postgres/store.go, a41cd6f1: the key is
// tenant.FromContext(ctx).ApplyPrefix(key), with an empty prefix): a LIST
// (GetList) is empty, with a resourceVersion; a GET is
// 404; a WATCH stays open and silent. Writes are refused by
// untenantedWriteFilter (cmd/ipam/admission.go, read at 20394db6), except
// deletecollection, which it lets through to delete nothing.
func (s *Service) serveUntenanted(w http.ResponseWriter, r *http.Request, q request) {
	switch q.verb {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		writeStatus(w, Untenanted())
	case "GET":
		writeError(w, apierrors.NewNotFound(schema.GroupResource{Group: Group, Resource: q.resource}, q.name))
	case "LIST", "DELETECOLLECTION":
		rv, err := s.currentRV(r.Context())
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"apiVersion": Group + "/" + q.version, "kind": kindOf(q.resource) + "List",
			"metadata": map[string]any{"resourceVersion": strconv.FormatUint(rv, 10)},
			"items":    []any{},
		})
	case "WATCH":
		s.silentWatch(w, r, q)
	default:
		s.proxy.ServeHTTP(w, r)
	}
}

// silentWatch is an untenanted watch: open until the client goes, the
// service stops or timeoutSeconds pass, with no event but, when the
// client asked for initial events and bookmarks (a client-go informer's
// watch-list), the bookmark that ends the (empty) initial events
// (internal/watch/postgres.go, a41cd6f1, sends it for sendInitialEvents;
// its 30 s bookmarks are left out).
func (s *Service) silentWatch(w http.ResponseWriter, r *http.Request, q request) {
	v := r.URL.Query()
	var timeout <-chan time.Time
	if secs, err := strconv.ParseInt(v.Get("timeoutSeconds"), 10, 64); err == nil && secs > 0 {
		t := time.NewTimer(time.Duration(secs) * time.Second)
		defer t.Stop()
		timeout = t.C
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	initial, _ := strconv.ParseBool(v.Get("sendInitialEvents"))
	bookmarks, _ := strconv.ParseBool(v.Get("allowWatchBookmarks"))
	if initial && bookmarks {
		rv, err := s.currentRV(r.Context())
		if err != nil {
			return
		}
		ev := map[string]any{"type": "BOOKMARK", "object": map[string]any{
			"apiVersion": Group + "/" + q.version, "kind": kindOf(q.resource),
			"metadata": map[string]any{
				"resourceVersion": strconv.FormatUint(rv, 10),
				"annotations":     map[string]any{metav1.InitialEventsAnnotationKey: "true"},
			},
		}}
		b, err := json.Marshal(ev)
		if err != nil {
			return
		}
		if _, err := w.Write(append(b, '\n')); err != nil {
			return
		}
	}
	if err := http.NewResponseController(w).Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return
	}
	select {
	case <-r.Context().Done():
	case <-timeout:
	}
}

// kindOf is the kind of an ipam resource.
func kindOf(resource string) string {
	switch resource {
	case "ipclaims":
		return "IPClaim"
	case "ipallocations":
		return "IPAllocation"
	case "ipclasses":
		return "IPClass"
	case "ippools":
		return "IPPool"
	}
	k := strings.TrimSuffix(resource, "s")
	if k == "" {
		return resource
	}
	return strings.ToUpper(k[:1]) + k[1:]
}
