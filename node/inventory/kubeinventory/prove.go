package kubeinventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

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
			if _, err := c.page(ctx, w.gvr, 1, pageQuery(1, ""), func(*proofItem) {}); err != nil {
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
		meta, err := c.page(ctx, w.gvr, n, pageQuery(c.pageSize, cont), each)
		if err != nil {
			return nil, err
		}
		if cont = meta.Continue; cont == "" {
			return objects, nil
		}
	}
}

// decodeList streams a list response to each, one item at a time, and
// returns its continue token. Decoding the page whole would hold its every
// byte and every item at once: at 5,000 objects a page, megabytes that the
// node would keep as resident memory long after the proof.
func decodeList(r io.Reader, each func(*proofItem)) (listMeta, error) {
	var meta listMeta
	dec := json.NewDecoder(r)
	if err := expectDelim(dec, '{'); err != nil {
		return meta, err
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return meta, err
		}
		switch key {
		case "metadata":
			if err := dec.Decode(&meta); err != nil {
				return meta, fmt.Errorf("metadata: %w", err)
			}
		case "items":
			if err := expectDelim(dec, '['); err != nil {
				return meta, fmt.Errorf("items: %w", err)
			}
			for n := 0; dec.More(); n++ {
				var it proofItem
				if err := dec.Decode(&it); err != nil {
					return meta, fmt.Errorf("item %d: %w", n, err)
				}
				meta.items++
				each(&it)
			}
			if err := expectDelim(dec, ']'); err != nil {
				return meta, fmt.Errorf("items: %w", err)
			}
		default:
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return meta, fmt.Errorf("%v: %w", key, err)
			}
		}
	}
	return meta, expectDelim(dec, '}')
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
