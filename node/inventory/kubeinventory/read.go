package kubeinventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
)

// reader makes the consistent reads of both inventory sources: plain list
// requests with no resourceVersion, which the API server answers at etcd's
// current revision, never from a cache that may be behind. Each request is
// bounded by Options.PageTimeout, from the request to its last byte
// decoded, and its answer is streamed, never held whole.
type reader struct {
	log  *slog.Logger
	host string
	http *http.Client
	opts Options
	// proven is when the newest consistent read that succeeded started
	// (unix nanoseconds): see ProvenAt.
	proven atomic.Int64

	probeMu  sync.Mutex
	probeErr error // the last probe's error, nil once one succeeds
}

func newReader(cfg *rest.Config, log *slog.Logger, opts Options) (*reader, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("inventory: http client: %w", err)
	}
	return &reader{log: log, host: strings.TrimSuffix(cfg.Host, "/"), http: hc, opts: opts}, nil
}

// probeLoop runs probe at once, then every interval, until ctx ends. A consistent read that
// started less than an interval ago and succeeded (a Prove's, say) stands
// for a probe; a failed probe is retried an interval after it started, so a
// partition costs no more requests than a healthy API server.
func (r *reader) probeLoop(ctx context.Context, interval time.Duration, probe func(context.Context) error) {
	var lastTry time.Time
	for {
		next := lastTry
		if p := r.ProvenAt(); p.After(next) {
			next = p
		}
		if wait := time.Until(next.Add(interval)); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue // a Prove may have moved ProvenAt meanwhile
		}
		if ctx.Err() != nil {
			return
		}
		lastTry = time.Now()
		r.noteProbe(ctx, probe(ctx))
	}
}

// noteProbe logs a probe's failure when it differs from the last one, and
// the first success after a failure, so that a partition logs once, not on
// every probe.
func (r *reader) noteProbe(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return // shutting down: not the API server's doing
	}
	r.probeMu.Lock()
	defer r.probeMu.Unlock()
	switch {
	case err != nil && (r.probeErr == nil || r.probeErr.Error() != err.Error()):
		r.log.Warn("inventory probe failed: readiness fails once the inventory is older than its bound", "error", err)
	case err == nil && r.probeErr != nil:
		r.log.Info("inventory probe succeeds again")
	}
	r.probeErr = err
}

// ProvenAt is when the newest consistent read that succeeded started; zero
// before the first. Watch events never move it: one arriving now may have
// been sent long ago by an API server that is far behind, or through a link
// that holds every answer back. With a probe every interval, a healthy API
// server keeps the age (time since ProvenAt) under the interval plus one
// round trip; an API server, or a link, d behind keeps it at d or more; a
// partition makes every probe fail and the age grows without bound.
func (r *reader) ProvenAt() time.Time {
	at := r.proven.Load()
	if at <= 0 {
		return time.Time{}
	}
	return time.Unix(0, at)
}

// markProven records that a consistent read started at start succeeded,
// unless a newer one already did: reads overlap (a probe during a Prove), and
// one that started earlier and ended later proves nothing newer.
func (r *reader) markProven(start time.Time) {
	at := start.UnixNano()
	for {
		old := r.proven.Load()
		if old >= at || r.proven.CompareAndSwap(old, at) {
			return
		}
	}
}

// listMeta is what a consistent read keeps of a list's metadata, and how
// many items it held.
type listMeta struct {
	Continue string `json:"continue"`
	// RemainingItemCount is how many objects the list holds beyond this
	// page; the API server sets it on a limited list without selectors.
	RemainingItemCount *int64 `json:"remainingItemCount"`
	items              int
}

// pageQuery asks for a page of at most limit objects, after cont.
func pageQuery(limit int, cont string) url.Values {
	q := url.Values{"limit": {strconv.Itoa(limit)}}
	if cont != "" {
		q.Set("continue", cont)
	}
	return q
}

// page reads page n (from 1) of a consistent list of gvr in every
// namespace, with query q, within Options.PageTimeout. An error names the
// page.
func (r *reader) page(ctx context.Context, gvr schema.GroupVersionResource, n int, q url.Values, each func(*proofItem)) (listMeta, error) {
	pageCtx, cancel := context.WithTimeoutCause(ctx, r.opts.PageTimeout, errPageTimeout)
	defer cancel()
	meta, err := r.fetch(pageCtx, gvr, q, each)
	if err == nil {
		return meta, nil
	}
	what := fmt.Sprintf("page %d", n)
	if l := q.Get("limit"); l != "" {
		what += " (limit " + l + ")"
	}
	if f := q.Get("fieldSelector"); f != "" {
		what += " (fieldSelector " + f + ")"
	}
	if errors.Is(context.Cause(pageCtx), errPageTimeout) {
		// This page's own bound, not the caller's: say so, with the bound.
		return meta, fmt.Errorf("%s: not answered within %s: %w", what, r.opts.PageTimeout, err)
	}
	return meta, fmt.Errorf("%s: %w", what, err)
}

// errPageTimeout is the cause of a page's context that ran out of
// Options.PageTimeout, which tells it from a caller's deadline.
var errPageTimeout = errors.New("page timeout")

// maxRetries bounds the retries of one request the API server asked to
// retry later, as client-go's rest client bounds them (10).
const maxRetries = 10

func (r *reader) fetch(ctx context.Context, gvr schema.GroupVersionResource, q url.Values, each func(*proofItem)) (listMeta, error) {
	u := fmt.Sprintf("%s/apis/%s/%s/%s?%s", r.host, gvr.Group, gvr.Version, gvr.Resource, q.Encode())
	resp, err := r.do(ctx, u)
	if err != nil {
		// The query (a continue token of a hundred characters) says
		// nothing to an operator; the host and resource do.
		var ue *url.Error
		if errors.As(err, &ue) {
			ue.URL, _, _ = strings.Cut(ue.URL, "?")
		}
		return listMeta{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var status metav1.Status
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(body, &status) == nil && status.Message != "" {
			return listMeta{}, fmt.Errorf("%s: %s", resp.Status, status.Message)
		}
		return listMeta{}, errors.New(resp.Status)
	}
	meta, err := decodeList(resp.Body, each)
	if err != nil {
		return listMeta{}, fmt.Errorf("decode list: %w", err)
	}
	return meta, nil
}

// do sends a GET of u, again after the delay the API server names when it
// answers 429 or 5xx with a Retry-After (a watch cache re-initializing
// answers 429 "storage is (re)initializing", Retry-After: 1), at most
// maxRetries times and never past ctx: what client-go's rest client does
// (k8s.io/client-go rest/with_retry.go, checkWait). Any other answer is
// the caller's.
func (r *reader) do(ctx context.Context, u string) (*http.Response, error) {
	for retry := 0; ; retry++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Accept", "application/json")
		resp, err := r.http.Do(req)
		if err != nil {
			return nil, err
		}
		wait, ok := retryAfter(resp)
		if !ok || retry == maxRetries {
			return resp, nil
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%s, retry after %s: %w", resp.Status, wait, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// retryAfter is the delay a 429 or 5xx answer asks for in whole seconds,
// as client-go reads it.
func retryAfter(resp *http.Response) (time.Duration, bool) {
	if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode < 500 {
		return 0, false
	}
	s, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || s < 0 {
		return 0, false
	}
	return time.Duration(s) * time.Second, true
}
