package kubeinventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/datum-cloud/galactic-node/node/inventory"
)

// proofPageSize bounds one page of a consistent read: 20,000 objects are
// read in four requests, and a page's decoded form stays small.
const proofPageSize = 5000

// Prove implements inventory.Prover: it lists every VPCAttachment and
// BGPAdvertisement with a consistent read (no resourceVersion: the API
// server answers at etcd's current revision, never from a stale cache) and
// builds a snapshot of what the API server holds at that moment. Objects are
// decoded only as far as the reclaim needs them. Each page is bounded by
// Options.PageTimeout, the whole read only by ctx: a slow API server that
// answers every page in time still proves. Any failure (403, a page not
// answered in time, refused) is an error naming the resource, and the page.
func (c *Cluster) Prove(ctx context.Context) (inventory.Snapshot, error) {
	// The answer is as new as the read's start at least: what the API
	// server held then, or later. ProvenAt counts from here, not from the
	// last page's arrival, which a slow link holds back.
	start := time.Now()
	var objects []inventory.Object
	for _, w := range c.sources {
		objs, err := c.list(ctx, w)
		if err != nil {
			return inventory.Snapshot{}, fmt.Errorf("%w: consistent read of %s: %w", inventory.ErrNotProvenCurrent, w.gvr.Resource, err)
		}
		objects = append(objects, objs...)
	}
	c.markProven(start)
	return inventory.NewSnapshot(objects, true, nil), nil
}

// ProvenAt implements inventory.Prover: when the newest consistent read of
// both resources that succeeded started, a Prove or a probe; zero before
// the first. The watches never move it (see newWatched): their events say
// nothing of how late they come. With a probe every interval, a healthy API
// server keeps the age (time since ProvenAt) under the interval plus one
// round trip; an API server, or a link, d behind keeps it at d or more; a
// partition makes every probe fail and the age grows without bound.
func (c *Cluster) ProvenAt() time.Time {
	at := c.proven.Load()
	if at <= 0 {
		return time.Time{}
	}
	return time.Unix(0, at)
}

// markProven records that a consistent read started at start succeeded,
// unless a newer one already did: reads overlap (a probe during a Prove), and
// one that started earlier and ended later proves nothing newer.
func (c *Cluster) markProven(start time.Time) {
	at := start.UnixNano()
	for {
		old := c.proven.Load()
		if old >= at || c.proven.CompareAndSwap(old, at) {
			return
		}
	}
}

// probeLoop probes every interval until ctx ends. A consistent read that
// started less than an interval ago and succeeded (a Prove's, say) stands
// for a probe; a failed probe is retried an interval after it started, so a
// partition costs no more requests than a healthy API server.
func (c *Cluster) probeLoop(ctx context.Context, interval time.Duration) {
	var lastTry time.Time
	for {
		next := lastTry
		if p := c.ProvenAt(); p.After(next) {
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
		c.noteProbe(ctx, c.probe(ctx))
	}
}

// probe lists one object of each resource consistently, both at once, and
// on success moves ProvenAt to when it started. It is the cheapest read that
// shows the API server answering at etcd's current revision now: the API
// server serves no object beyond the first, however many it holds.
func (c *Cluster) probe(ctx context.Context) error {
	start := time.Now()
	errs := make([]error, len(c.sources))
	var wg sync.WaitGroup
	for i, w := range c.sources {
		wg.Go(func() {
			if _, err := c.listPage(ctx, w, 1, 1, "", func(*proofItem) {}); err != nil {
				errs[i] = fmt.Errorf("%s: %w", w.gvr.Resource, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: probe: %w", inventory.ErrNotProvenCurrent, err)
	}
	c.markProven(start)
	return nil
}

// noteProbe logs a probe's failure when it differs from the last one, and
// the first success after a failure, so that a partition logs once, not on
// every probe.
func (c *Cluster) noteProbe(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return // shutting down: not the API server's doing
	}
	c.probeMu.Lock()
	defer c.probeMu.Unlock()
	switch {
	case err != nil && (c.probeErr == nil || c.probeErr.Error() != err.Error()):
		c.log.Warn("inventory probe failed: readiness fails once the inventory is older than its bound", "error", err)
	case err == nil && c.probeErr != nil:
		c.log.Info("inventory probe succeeds again")
	}
	c.probeErr = err
}

// proofItem is the part of a listed object a consistent read decodes.
type proofItem struct {
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Status struct {
		VPC           string `json:"vpc"`
		VPCAttachment string `json:"vpcAttachment"`
	} `json:"status"`
}

// list reads every object of w's resource, consistently, page by page.
func (c *Cluster) list(ctx context.Context, w *watched) ([]inventory.Object, error) {
	var objects []inventory.Object
	each := func(it *proofItem) {
		objects = append(objects, w.fromFields(it.Metadata.Namespace, it.Metadata.Name, it.Status.VPC, it.Status.VPCAttachment))
	}
	cont := ""
	for n := 1; ; n++ {
		var err error
		if cont, err = c.listPage(ctx, w, n, c.pageSize, cont, each); err != nil {
			return nil, err
		}
		if cont == "" {
			return objects, nil
		}
	}
}

// listPage reads page n (from 1) of a consistent list of w's resource, of
// at most limit objects, within Options.PageTimeout: from the request to
// the last byte of the answer decoded. An error names the page.
func (c *Cluster) listPage(ctx context.Context, w *watched, n, limit int, cont string, each func(*proofItem)) (string, error) {
	pageCtx, cancel := context.WithTimeoutCause(ctx, c.opts.PageTimeout, errPageTimeout)
	defer cancel()
	next, err := c.fetchPage(pageCtx, w, limit, cont, each)
	if err == nil {
		return next, nil
	}
	if errors.Is(context.Cause(pageCtx), errPageTimeout) {
		// This page's own bound, not the caller's: say so, with the bound.
		return "", fmt.Errorf("page %d (limit %d): not answered within %s: %w", n, limit, c.opts.PageTimeout, err)
	}
	return "", fmt.Errorf("page %d (limit %d): %w", n, limit, err)
}

// errPageTimeout is the cause of a page's context that ran out of
// Options.PageTimeout, which tells it from a caller's deadline.
var errPageTimeout = errors.New("page timeout")

func (c *Cluster) fetchPage(ctx context.Context, w *watched, limit int, cont string, each func(*proofItem)) (string, error) {
	gvr := w.gvr
	q := url.Values{"limit": {strconv.Itoa(limit)}}
	if cont != "" {
		q.Set("continue", cont)
	}
	u := fmt.Sprintf("%s/apis/%s/%s/%s?%s", c.host, gvr.Group, gvr.Version, gvr.Resource, q.Encode())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		// The query (a continue token of a hundred characters) says
		// nothing to an operator; the host and resource do.
		var ue *url.Error
		if errors.As(err, &ue) {
			ue.URL, _, _ = strings.Cut(ue.URL, "?")
		}
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var status metav1.Status
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(body, &status) == nil && status.Message != "" {
			return "", fmt.Errorf("%s: %s", resp.Status, status.Message)
		}
		return "", errors.New(resp.Status)
	}
	next, err := decodeList(resp.Body, each)
	if err != nil {
		return "", fmt.Errorf("decode list: %w", err)
	}
	return next, nil
}

// decodeList streams a list response to each, one item at a time, and
// returns its continue token. Decoding the page whole would hold its every
// byte and every item at once: at 5,000 objects a page, megabytes that the
// node would keep as resident memory long after the proof.
func decodeList(r io.Reader, each func(*proofItem)) (string, error) {
	dec := json.NewDecoder(r)
	if err := expectDelim(dec, '{'); err != nil {
		return "", err
	}
	var next string
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return "", err
		}
		switch key {
		case "metadata":
			var meta struct {
				Continue string `json:"continue"`
			}
			if err := dec.Decode(&meta); err != nil {
				return "", fmt.Errorf("metadata: %w", err)
			}
			next = meta.Continue
		case "items":
			if err := expectDelim(dec, '['); err != nil {
				return "", fmt.Errorf("items: %w", err)
			}
			for n := 0; dec.More(); n++ {
				var it proofItem
				if err := dec.Decode(&it); err != nil {
					return "", fmt.Errorf("item %d: %w", n, err)
				}
				each(&it)
			}
			if err := expectDelim(dec, ']'); err != nil {
				return "", fmt.Errorf("items: %w", err)
			}
		default:
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return "", fmt.Errorf("%v: %w", key, err)
			}
		}
	}
	return next, expectDelim(dec, '}')
}

func expectDelim(dec *json.Decoder, want json.Delim) error {
	t, err := dec.Token()
	if err != nil {
		return err
	}
	if t != want {
		return fmt.Errorf("want %v, found %v", want, t)
	}
	return nil
}
