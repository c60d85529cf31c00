package kubeinventory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory"
)

// Field selectors the VPCAttachment CRD must declare (selectableFields) for
// Candidates to ask by identity.
const (
	FieldVPC        = "status.vpc"
	FieldAttachment = "status.vpcAttachment"
)

// maxCarriers bounds the carriers one read of an identity returns: one
// shows it carried, and a view names no more than inventory.MaxNamed. So an
// ask costs a few KiB per identity, however many objects a tenant makes
// carry it.
const maxCarriers = inventory.MaxNamed

// maxAsksInFlight bounds the requests one Ask keeps open at once: a pass
// with many candidates must not open a connection's worth of streams.
const maxAsksInFlight = 8

// Candidates reads the inventory without a copy of the cluster: it holds
// no watch and no object, and a pass asks it, with consistent reads made
// then, about the identities of its unheld taps only. For each identity it
// lists the VPCAttachments whose status.vpc and status.vpcAttachment spell
// it (a field selector on the CRD's selectableFields), and the
// BGPAdvertisements named by it in either encoding ParseAdvertisementName
// reads (a field selector on metadata.name): three requests of an object or
// none each, whatever the cluster's size. A selector matches strings, not
// numbers, so this reads every carrier only where admission admits one
// spelling of each identity (deploy/crds, deploy/admission: no leading
// zeros) and refuses what does not parse; docs/scale.md says why each rule
// the informers checked on every object holds here.
//
// Health and size come from one more read of one object: how many
// VPCAttachments there are (the remainingItemCount of a list of one), and,
// when that one object carries an identity, that some VPCAttachment does.
// Only when it does not (the first attachment in key order has no identity
// yet) is the health read apart: a field selector status.vpc!=,
// status.vpcAttachment!= (the API server selects an absent field as "").
// Each list the API server answers from its watch cache costs it about as
// much as the resource has objects, whatever the limit (BenchmarkReadCost:
// 21 ms of its CPU at 70,000 attachments), so a read saved is worth as much
// as a scan. Start repeats the read every Options.ProbeInterval, so that
// Snapshot, readiness and the brake's shrink rule know the cluster between
// passes that ask.
type Candidates struct {
	*reader

	mu   sync.Mutex
	last inventory.Snapshot // the newest read's health and size
}

// NewCandidates prepares a Candidates source over cfg; Start runs its probe.
func NewCandidates(cfg *rest.Config, log *slog.Logger, opts Options) (*Candidates, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.PageTimeout <= 0 {
		opts.PageTimeout = DefaultPageTimeout
	}
	if opts.ProbeInterval < 0 {
		return nil, fmt.Errorf("inventory: negative probe interval %s", opts.ProbeInterval)
	}
	rd, err := newReader(cfg, log, opts)
	if err != nil {
		return nil, err
	}
	return &Candidates{reader: rd, last: inventory.NewSnapshot(nil, false, nil)}, nil
}

// Start reads the cluster's health and size at once, then every
// Options.ProbeInterval (skipped while an Ask newer than that succeeded),
// until ctx ends; with no interval, once. It returns at once.
func (c *Candidates) Start(ctx context.Context) {
	probe := func(ctx context.Context) error { _, err := c.Ask(ctx, nil); return err }
	if c.opts.ProbeInterval <= 0 {
		go func() { c.noteProbe(ctx, probe(ctx)) }()
		return
	}
	go c.probeLoop(ctx, c.opts.ProbeInterval, probe)
}

// Snapshot implements inventory.Source without a request: the health and
// size of the newest read, carrying no identity.
func (c *Candidates) Snapshot(context.Context) inventory.Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// Ask implements inventory.Asker: 1 + up to 3 requests per identity, and
// 1 more when the counted attachment carries no identity, at most
// maxAsksInFlight at once, each a consistent read. ids may repeat; with
// none it reads health and size only.
func (c *Candidates) Ask(ctx context.Context, ids []identity.Identity) (inventory.Snapshot, error) {
	start := time.Now()
	ids = slices.Clone(ids)
	slices.SortFunc(ids, func(a, b identity.Identity) int {
		return cmp.Or(cmp.Compare(a.VPC, b.VPC), cmp.Compare(a.Attachment, b.Attachment))
	})
	ids = slices.Compact(ids)

	var (
		mu       sync.Mutex
		objects  []inventory.Object
		size     int
		carrying bool // some VPCAttachment carries an identity
		errs     []error
	)
	add := func(o inventory.Object) {
		mu.Lock()
		objects = append(objects, o)
		mu.Unlock()
	}
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	sem := make(chan struct{}, maxAsksInFlight)
	var wg sync.WaitGroup
	read := func(what string, gvr schema.GroupVersionResource, q url.Values, each func(*proofItem), done func(listMeta) error) {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			meta, err := c.page(ctx, gvr, 1, q, each)
			if err == nil && done != nil {
				err = done(meta)
			}
			if err != nil {
				fail(fmt.Errorf("%s: %w", what, err))
			}
		})
	}
	// noteCarrying applies the selector status.vpc!=,status.vpcAttachment!=
	// to one object, as the API server applies it.
	noteCarrying := func(it *proofItem) {
		if it.Status.VPC != "" && it.Status.VPCAttachment != "" {
			mu.Lock()
			carrying = true
			mu.Unlock()
		}
	}
	read("vpcattachments counted", AttachmentResource, pageQuery(1, ""), noteCarrying, func(m listMeta) error {
		n := m.items
		switch {
		case m.RemainingItemCount != nil:
			n += int(*m.RemainingItemCount)
		case m.Continue != "":
			return errors.New("the API server did not count the objects beyond the first (no remainingItemCount)")
		}
		mu.Lock()
		size = n
		mu.Unlock()
		return nil
	})
	for _, id := range ids {
		vpc, att := id.VPC.Base62(), id.Attachment.Base62()
		read("vpcattachments carrying "+id.String(), AttachmentResource, selectorQuery(maxCarriers, FieldVPC+"="+vpc+","+FieldAttachment+"="+att),
			func(it *proofItem) {
				add(inventory.AttachmentObject(it.Metadata.Namespace, it.Metadata.Name, it.Status.VPC, it.Status.VPCAttachment))
			}, nil)
		for _, name := range AdvertisementNames(id) {
			read("bgpadvertisements named "+name, AdvertisementResource, selectorQuery(maxCarriers, "metadata.name="+name),
				func(it *proofItem) { add(inventory.AdvertisementObject(it.Metadata.Namespace, it.Metadata.Name)) }, nil)
		}
	}
	wg.Wait()
	if len(errs) == 0 && !carrying && size > 0 {
		read("vpcattachments carrying any identity", AttachmentResource, selectorQuery(1, FieldVPC+"!=,"+FieldAttachment+"!="), noteCarrying, nil)
		wg.Wait()
	}
	if err := errors.Join(errs...); err != nil {
		err = fmt.Errorf("%w: consistent read: %w", inventory.ErrNotProvenCurrent, err)
		c.mu.Lock()
		c.last.Err = err
		c.mu.Unlock()
		return inventory.Snapshot{}, err
	}
	snap := inventory.NewAskedSnapshot(objects, carrying, size)
	c.markProven(start)
	c.mu.Lock()
	c.last = inventory.NewAskedSnapshot(nil, carrying, size)
	c.mu.Unlock()
	return snap, nil
}

// AdvertisementNames returns the BGPAdvertisement names that carry id, as
// ParseAdvertisementName reads names: its lower-case hex spelling and its
// base62 spelling, each without leading zeros (admission refuses others),
// the latter only where it can be an object's name at all (no upper case).
func AdvertisementNames(id identity.Identity) []string {
	names := []string{id.AdvertisementName()}
	if b62 := id.VPC.Base62() + "-" + id.Attachment.Base62(); b62 != names[0] && len(validation.IsDNS1123Subdomain(b62)) == 0 {
		names = append(names, b62)
	}
	return names
}

// selectorQuery lists at most limit of the objects field selects.
func selectorQuery(limit int, field string) url.Values {
	q := pageQuery(limit, "")
	q.Set("fieldSelector", field)
	return q
}
