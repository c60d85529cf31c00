package kubeinventory

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// An API server whose watch cache re-initializes answers 429 "storage is
// (re)initializing" with Retry-After: 1 for a while; a read waits as asked
// and is answered, as client-go's are; a 429 without Retry-After, or one
// that outlasts the page's bound, fails the read. The real API server
// cannot be made to re-initialize on demand, so a handler stands in for it
// (the integration test of 20,000 attachments met the real one).
func TestAReadRetriesWhatTheAPIServerAsksToRetry(t *testing.T) {
	var calls atomic.Int64
	var failFor atomic.Int64 // answers to refuse
	var retryAfter atomic.Value
	retryAfter.Store("0")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if failFor.Add(-1) >= 0 {
			if v := retryAfter.Load().(string); v != "" {
				w.Header().Set("Retry-After", v)
			}
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(`{"kind":"Status","message":"storage is (re)initializing"}`))
			return
		}
		_, _ = w.Write([]byte(`{"metadata":{},"items":[{"metadata":{"name":"a","namespace":"n"}}]}`))
	}))
	defer srv.Close()
	rd, err := newReader(&rest.Config{Host: srv.URL}, slog.New(slog.DiscardHandler), Options{PageTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	read := func() error {
		_, err := rd.page(context.Background(), AttachmentResource, 1, pageQuery(1, ""), func(*proofItem) {})
		return err
	}
	failFor.Store(3)
	if err := read(); err != nil || calls.Load() != 4 {
		t.Fatalf("three 429s with Retry-After: 0, then 200: %v after %d requests, want success after 4", err, calls.Load())
	}
	calls.Store(0)
	failFor.Store(1)
	retryAfter.Store("")
	if err := read(); err == nil || !strings.Contains(err.Error(), "storage is (re)initializing") || calls.Load() != 1 {
		t.Fatalf("a 429 without Retry-After: %v after %d requests, want it failed at once, saying why", err, calls.Load())
	}
	calls.Store(0)
	failFor.Store(100)
	retryAfter.Store("1")
	if err := read(); err == nil || !strings.Contains(err.Error(), "not answered within 2s") {
		t.Fatalf("429s that outlast the page's bound: %v, want the bound named", err)
	}
}
