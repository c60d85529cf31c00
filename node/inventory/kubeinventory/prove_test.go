package kubeinventory

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
)

// consistentRead reports whether r is a consistent read (a page of Prove,
// a probe's list): a list with a limit and no resourceVersion. The
// informers' lists name a resourceVersion, their watches say watch.
func consistentRead(r *http.Request) bool {
	q := r.URL.Query()
	return q.Has("limit") && !q.Has("resourceVersion") && !q.Has("watch")
}

// readHook sees each consistent read at the transport: before, when it is
// sent (an error fails it there); after, once its answer's headers are in,
// before the caller gets them (it may hold them back).
type readHook struct {
	before func(r *http.Request) error
	after  func(r *http.Request)
}

func (h *readHook) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if !consistentRead(r) {
			return rt.RoundTrip(r)
		}
		if h.before != nil {
			if err := h.before(r); err != nil {
				return nil, err
			}
		}
		resp, err := rt.RoundTrip(r)
		if err == nil && h.after != nil {
			h.after(r)
		}
		return resp, err
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// startWith is start with opts and hook on the consistent reads.
func startWith(t *testing.T, cluster *clustertest.Cluster, opts Options, hook *readHook) (*Cluster, context.CancelFunc) {
	t.Helper()
	cfg := rest.CopyConfig(cluster.Config)
	if hook != nil {
		cfg.WrapTransport = hook.wrap
	}
	c, err := NewCluster(cfg, nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.Start(ctx)
	if !c.WaitForSync(ctx) {
		t.Fatal("never synced")
	}
	return c, cancel
}

// attachments creates n attachments carrying identities of VPC 0x77.
func attachments(t *testing.T, cluster *clustertest.Cluster, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		id := identity.Identity{VPC: 0x77, Attachment: identity.Attachment(i)}
		cluster.Apply(t, AttachmentResource, clustertest.Attachment("tenant-p", fmt.Sprintf("att-%d", i), id.VPC.Base62(), id.Attachment.Base62()))
	}
}

// What the watches deliver (the initial list, events) never shows the
// inventory current: only a consistent read does. A ProvenAt that counted
// watch events (or bookmarks, which arrive the same way) would be set here
// before any Prove.
func TestWatchEventsProveNothing(t *testing.T) {
	cluster := clustertest.Shared(t)
	clean(t, cluster)
	c := start(t, cluster)
	if at := c.ProvenAt(); !at.IsZero() {
		t.Fatalf("proven at %s by the informers' list alone", at)
	}
	attachments(t, cluster, 0, 1)
	eventually(t, c, "the watch delivered the attachment", func(s *inventory.Snapshot) bool { return s.Attachments == 1 })
	if at := c.ProvenAt(); !at.IsZero() {
		t.Fatalf("proven at %s by a watch event", at)
	}

	before := time.Now()
	if _, err := c.Prove(context.Background()); err != nil {
		t.Fatal(err)
	}
	proven := c.ProvenAt()
	if proven.Before(before) {
		t.Fatalf("proven at %s, before the Prove started at %s", proven, before)
	}
	attachments(t, cluster, 1, 1)
	eventually(t, c, "the watch delivered the second attachment", func(s *inventory.Snapshot) bool { return s.Attachments == 2 })
	if at := c.ProvenAt(); !at.Equal(proven) {
		t.Fatalf("a watch event moved ProvenAt from %s to %s", proven, at)
	}
}

// ProvenAt is when the read started, not when its answer arrived: an answer
// held back (a slow API server, a slow link) proves only the moment it was
// asked for. Every answer here is held back at the transport, and ProvenAt
// must come before the first was let through.
func TestProvenAtIsWhenTheReadStarted(t *testing.T) {
	cluster := clustertest.Shared(t)
	clean(t, cluster)
	attachments(t, cluster, 0, 1)
	var mu sync.Mutex
	var firstLetThrough time.Time
	c, _ := startWith(t, cluster, Options{}, &readHook{after: func(*http.Request) {
		time.Sleep(200 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		if firstLetThrough.IsZero() {
			firstLetThrough = time.Now()
		}
	}})
	before := time.Now()
	if _, err := c.Prove(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if at := c.ProvenAt(); at.Before(before) || !at.Before(firstLetThrough) {
		t.Fatalf("proven at %s: want from the read's start (%s), before its first answer was let through (%s)", at, before, firstLetThrough)
	}
}

// Each page has its own bound, the read as a whole none: nine pages, each
// held back well within the bound, take longer than the bound, and prove.
func TestEachPageHasItsOwnTimeout(t *testing.T) {
	const hold, bound = 600 * time.Millisecond, 4 * time.Second
	cluster := clustertest.Shared(t)
	clean(t, cluster)
	attachments(t, cluster, 0, 15)
	var pages atomic.Int64
	c, _ := startWith(t, cluster, Options{PageTimeout: bound}, &readHook{after: func(*http.Request) {
		pages.Add(1)
		time.Sleep(hold)
	}})
	c.pageSize = 2
	start := time.Now()
	proof, err := c.Prove(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if proof.Attachments != 15 || pages.Load() != 9 {
		t.Fatalf("proof of %d attachments in %d pages, want 15 in 9 (8 of attachments, 1 of advertisements)", proof.Attachments, pages.Load())
	}
	if took <= bound {
		t.Fatalf("the read took %s, not beyond the page bound %s: the test shows nothing", took, bound)
	}
}

// A page not answered within its bound fails the proof, naming the
// resource, the page and the bound, and proves nothing.
func TestAPageNotAnsweredInTimeFailsTheProof(t *testing.T) {
	cluster := clustertest.Shared(t)
	clean(t, cluster)
	attachments(t, cluster, 0, 5)
	var page atomic.Int64
	c, _ := startWith(t, cluster, Options{PageTimeout: 3 * time.Second}, &readHook{before: func(r *http.Request) error {
		if strings.Contains(r.URL.Path, "vpcattachments") && page.Add(1) == 3 {
			<-r.Context().Done() // an API server that never answers page 3
			return r.Context().Err()
		}
		return nil
	}})
	c.pageSize = 2
	_, err := c.Prove(context.Background())
	if !errors.Is(err, inventory.ErrNotProvenCurrent) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Prove with page 3 unanswered: %v", err)
	}
	for _, want := range []string{"consistent read of vpcattachments", "page 3 (limit 2)", "not answered within 3s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "continue=") {
		t.Errorf("error %q quotes the continue token", err)
	}
	if at := c.ProvenAt(); !at.IsZero() {
		t.Fatalf("a failed read proved at %s", at)
	}

	// The caller's own deadline is the caller's: not blamed on a page.
	page.Store(0)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.Prove(ctx); !errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "not answered within") {
		t.Fatalf("Prove past the caller's deadline: %v", err)
	}
}

// The probe moves ProvenAt while the API server answers it, leaves it
// where it is while every probe fails (a partition), whatever the watches
// deliver meanwhile, moves it again once the API server answers, and stops
// with its context.
func TestTheProbeProvesOnlyWhileTheAPIServerAnswers(t *testing.T) {
	cluster := clustertest.Shared(t)
	clean(t, cluster)
	attachments(t, cluster, 0, 1)
	var failing atomic.Bool
	var failed, probes atomic.Int64
	errCut := errors.New("cut off")
	c, cancel := startWith(t, cluster, Options{ProbeInterval: 50 * time.Millisecond}, &readHook{before: func(r *http.Request) error {
		if r.URL.Query().Get("limit") != "1" {
			return nil
		}
		probes.Add(1)
		if failing.Load() {
			failed.Add(1)
			return errCut
		}
		return nil
	}})
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("never: %s", what)
			}
		}
	}
	waitFor("a first probe proves", func() bool { return !c.ProvenAt().IsZero() })
	first := c.ProvenAt()
	waitFor("a later probe proves again", func() bool { return c.ProvenAt().After(first) })

	failing.Store(true)
	// A probe that passed the switch before it was thrown may still
	// succeed: take ProvenAt once two probes have failed since.
	waitFor("two probes fail", func() bool { return failed.Load() >= 4 })
	cut := c.ProvenAt()
	attachments(t, cluster, 1, 1)
	eventually(t, c, "the watch delivered an attachment during the cut", func(s *inventory.Snapshot) bool { return s.Attachments == 2 })
	n := failed.Load()
	waitFor("four more probes fail", func() bool { return failed.Load() >= n+8 })
	if at := c.ProvenAt(); !at.Equal(cut) {
		t.Fatalf("ProvenAt moved from %s to %s while every probe failed", cut, at)
	}

	failing.Store(false)
	waitFor("a probe proves again once the API server answers", func() bool { return c.ProvenAt().After(cut) })

	cancel()
	stopped := make(chan struct{})
	go func() { c.probing.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("the probe did not stop with its context")
	}
	if n := probes.Load(); n < 2 {
		t.Fatalf("%d probe requests", n)
	}
}

// A Prove that succeeded less than an interval ago stands for a probe: with
// an hour's interval, a Cluster proven by hand makes no probe at all.
func TestAProveStandsForAProbe(t *testing.T) {
	cluster := clustertest.Shared(t)
	clean(t, cluster)
	attachments(t, cluster, 0, 1)
	var probes atomic.Int64
	hook := &readHook{before: func(r *http.Request) error {
		if r.URL.Query().Get("limit") == "1" {
			probes.Add(1)
		}
		return nil
	}}
	cfg := rest.CopyConfig(cluster.Config)
	cfg.WrapTransport = hook.wrap
	c, err := NewCluster(cfg, nil, Options{ProbeInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Prove(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.Start(ctx)
	if !c.WaitForSync(ctx) {
		t.Fatal("never synced")
	}
	cancel()
	c.probing.Wait()
	if n := probes.Load(); n != 0 {
		t.Fatalf("%d probe requests after a Prove, want 0", n)
	}
}

// decodeList streams a page: every item in order, the continue token and
// the count of what remains wherever the API server puts it, other keys skipped; a page that ends
// early or is not a list is an error, never a short list taken as whole.
func TestDecodeListStreamsAPageAndRefusesATruncatedOne(t *testing.T) {
	page := `{"kind":"VPCAttachmentList","apiVersion":"v1","items":[` +
		`{"metadata":{"name":"a","namespace":"n","labels":{"x":"y"}},"spec":{"vpc":{"name":"v"}},"status":{"vpc":"1","vpcAttachment":"2"}},` +
		`{"metadata":{"name":"b","namespace":"n"},"status":{}}` +
		`],"metadata":{"resourceVersion":"7","continue":"next-page","remainingItemCount":40}}`
	var got []string
	meta, err := decodeList(strings.NewReader(page), func(it *proofItem) {
		got = append(got, it.Metadata.Namespace+"/"+it.Metadata.Name+":"+it.Status.VPC+"/"+it.Status.VPCAttachment)
	})
	if err != nil || meta.Continue != "next-page" || meta.RemainingItemCount == nil || *meta.RemainingItemCount != 40 || meta.items != 2 ||
		!slices.Equal(got, []string{"n/a:1/2", "n/b:/"}) {
		t.Fatalf("decodeList = %+v, %v; items %q", meta, err, got)
	}
	for _, bad := range []string{page[:len(page)/2], page[:len(page)-1], `[]`, `{"items":{}}`, `{"items":[1]}`, ``} {
		if _, err := decodeList(strings.NewReader(bad), func(*proofItem) {}); err == nil {
			t.Errorf("decodeList(%.40q...) = nil error", bad)
		}
	}
}
