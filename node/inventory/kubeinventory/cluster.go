// Package kubeinventory reads the inventory from the API server: watches
// over VPCAttachments and BGPAdvertisements in all namespaces, kept in an
// inventory.Index that updates the identity map event by event, and
// the consistent read that proves them current. It is the one package of the
// inventory that links client-go; the rule and the types are node/inventory's.
package kubeinventory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/datum-cloud/galactic-node/node/inventory"
)

// Resources read by the cluster source.
var (
	AttachmentResource    = schema.GroupVersionResource{Group: "cloud.datumapis.com", Version: "v1alpha1", Resource: "vpcattachments"}
	AdvertisementResource = schema.GroupVersionResource{Group: "network.datumapis.com", Version: "v1alpha1", Resource: "bgpadvertisements"}
)

// Cluster reads the inventory from the API server through watches over
// VPCAttachments and BGPAdvertisements in all namespaces. After the initial
// list, it follows the watches: a Snapshot makes no API request. Objects are
// trimmed to an inventory.Object as they arrive, and the watches' store is
// an inventory.Index, which keeps the identity map up to date one event at a
// time: a Snapshot while nothing changed costs nothing, and no snapshot can
// miss an object the store holds, since the store is the map.
type Cluster struct {
	index   *inventory.Index
	sources []*watched

	// reader serves consistent reads (Prove and the probes), outside the
	// watches.
	*reader
	// pageSize is how many objects one page of Prove asks for:
	// proofPageSize, smaller in this package's tests.
	pageSize int

	// probing runs while the probe does, for tests that it stops.
	probing sync.WaitGroup
}

// Options tune a Cluster. The zero value is a Cluster that bounds each page
// of a consistent read by DefaultPageTimeout and never probes.
type Options struct {
	// PageTimeout bounds each request of a consistent read: every page of
	// Prove, every list of a probe. The read as a whole is bounded by its
	// caller's context only: a slow API server answering each page in time
	// still proves, however many pages there are. Default
	// DefaultPageTimeout.
	PageTimeout time.Duration
	// ProbeInterval is how often Start's probe reads both resources
	// consistently, one object each, to move ProvenAt while no Prove does;
	// a probe is skipped while a consistent read that started less than an
	// interval ago succeeded. 0: no probe, ProvenAt moves only with Prove.
	ProbeInterval time.Duration
}

// DefaultPageTimeout is Options.PageTimeout when unset.
const DefaultPageTimeout = 10 * time.Second

// watched is one resource's watch and the health of its list/watch calls.
type watched struct {
	gvr        schema.GroupVersionResource
	kind       string
	ctrl       cache.Controller
	fromFields func(namespace, name, vpc, attachment string) inventory.Object

	mu      sync.Mutex
	lastErr error
}

// NewCluster prepares informers over cfg; Start runs them (and the probe,
// when opts ask for one). opts is optional: at most one may be given.
func NewCluster(cfg *rest.Config, log *slog.Logger, opts ...Options) (*Cluster, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var o Options
	switch len(opts) {
	case 0:
	case 1:
		o = opts[0]
	default:
		return nil, errors.New("inventory: NewCluster takes at most one Options")
	}
	if o.PageTimeout <= 0 {
		o.PageTimeout = DefaultPageTimeout
	}
	if o.ProbeInterval < 0 {
		return nil, fmt.Errorf("inventory: negative probe interval %s", o.ProbeInterval)
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("inventory: client: %w", err)
	}
	rd, err := newReader(cfg, log, o)
	if err != nil {
		return nil, err
	}
	c := &Cluster{index: inventory.NewIndex(), reader: rd, pageSize: proofPageSize}
	for _, r := range []struct {
		gvr        schema.GroupVersionResource
		kind       string
		fromFields func(namespace, name, vpc, attachment string) inventory.Object
	}{
		{AttachmentResource, inventory.AttachmentKind, inventory.AttachmentObject},
		{AdvertisementResource, inventory.AdvertisementKind, func(namespace, name, _, _ string) inventory.Object {
			return inventory.AdvertisementObject(namespace, name)
		}},
	} {
		w, err := newWatched(dc.Resource(r.gvr), r.gvr, r.kind, r.fromFields, c.index, log)
		if err != nil {
			return nil, err
		}
		c.sources = append(c.sources, w)
	}
	return c, nil
}

func newWatched(ri dynamic.NamespaceableResourceInterface, gvr schema.GroupVersionResource, kind string, fromFields func(namespace, name, vpc, attachment string) inventory.Object, index *inventory.Index, log *slog.Logger) (*watched, error) {
	w := &watched{gvr: gvr, kind: kind, fromFields: fromFields}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			list, err := ri.Namespace(metav1.NamespaceAll).List(ctx, opts)
			w.record(err, log)
			return list, err
		},
		// What the watches deliver never moves ProvenAt: a watch event,
		// or a bookmark, arriving now may have been sent long ago by an API
		// server that is far behind, or through a link that holds every
		// answer back. Only a consistent read started at a known time says
		// how new the API server's answer is.
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			wi, err := ri.Namespace(metav1.NamespaceAll).Watch(ctx, opts)
			w.record(err, log)
			return wi, err
		},
	}
	store := &indexStore{kind: kind, index: index}
	// A DeltaFIFO and a controller, as a shared informer builds them, but
	// with the Index as the store: an informer's own store would keep every
	// object a second time (its cache key, its metadata), and a map built
	// beside it from event handlers would trail it, so that a snapshot could
	// miss an object the store already holds.
	fifo := cache.NewDeltaFIFOWithOptions(cache.DeltaFIFOOptions{
		KnownObjects:          store,
		EmitDeltaTypeReplaced: true,
		Transformer: func(obj any) (any, error) {
			if u, ok := obj.(*unstructured.Unstructured); ok {
				vpc, _, _ := unstructured.NestedString(u.Object, "status", "vpc")
				att, _, _ := unstructured.NestedString(u.Object, "status", "vpcAttachment")
				return &cachedObject{ObjectMeta: metav1.ObjectMeta{Name: u.GetName(), Namespace: u.GetNamespace()},
					Object: fromFields(u.GetNamespace(), u.GetName(), vpc, att)}, nil
			}
			return obj, nil // tombstones and already trimmed objects
		},
	})
	w.ctrl = cache.New(&cache.Config{
		Queue:             fifo,
		ListerWatcher:     lw,
		ObjectType:        &unstructured.Unstructured{},
		ObjectDescription: gvr.Resource,
		Process: func(obj any, _ bool) error {
			deltas, ok := obj.(cache.Deltas)
			if !ok {
				return fmt.Errorf("inventory: %s: %T popped, not Deltas", gvr.Resource, obj)
			}
			for _, d := range deltas {
				if err := store.apply(d); err != nil {
					return fmt.Errorf("inventory: %s: %w", gvr.Resource, err)
				}
			}
			return nil
		},
		WatchErrorHandlerWithContext: func(_ context.Context, _ *cache.Reflector, err error) {
			w.record(err, log)
		},
	})
	return w, nil
}

// indexStore is one resource's view of the Index, as its DeltaFIFO asks
// for it: which objects the store holds, so that a relist turns the objects
// it no longer lists into deletions.
type indexStore struct {
	kind  string
	index *inventory.Index
}

// apply writes one change to the Index. A deletion may be a tombstone
// (cache.DeletedFinalStateUnknown: deleted while the watch was down, seen
// missing from a relist), which names the object by its key.
func (s *indexStore) apply(d cache.Delta) error {
	if d.Type == cache.Deleted {
		if t, ok := d.Object.(cache.DeletedFinalStateUnknown); ok {
			ns, name, err := cache.SplitMetaNamespaceKey(t.Key)
			if err != nil {
				return err
			}
			s.index.Delete(inventory.ObjectRef{Kind: s.kind, Namespace: ns, Name: name})
			return nil
		}
	}
	co, ok := d.Object.(*cachedObject)
	if !ok {
		return fmt.Errorf("%s of a %T", d.Type, d.Object)
	}
	if d.Type == cache.Deleted {
		s.index.Delete(co.Object.Ref)
	} else { // Added, Updated, Replaced, Sync
		s.index.Set(co.Object)
	}
	return nil
}

// ListKeys implements cache.KeyLister.
func (s *indexStore) ListKeys() []string {
	refs := s.index.Refs(s.kind)
	keys := make([]string, len(refs))
	for i, r := range refs {
		keys[i] = r.Namespace + "/" + r.Name
	}
	return keys
}

// GetByKey implements cache.KeyGetter.
func (s *indexStore) GetByKey(key string) (any, bool, error) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil, false, err
	}
	o, ok := s.index.Get(inventory.ObjectRef{Kind: s.kind, Namespace: ns, Name: name})
	if !ok {
		return nil, false, nil
	}
	return &cachedObject{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Object: o}, true, nil
}

// record keeps the last error of a list or watch call; a successful call
// clears it, since the informer is then reading again.
func (w *watched) record(err error, log *slog.Logger) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil && (w.lastErr == nil || w.lastErr.Error() != err.Error()) {
		log.Warn("inventory read failed", "resource", w.gvr.Resource, "error", err)
	}
	if err == nil && w.lastErr != nil {
		log.Info("inventory reads again", "resource", w.gvr.Resource)
	}
	if err != nil {
		err = fmt.Errorf("%s: %w", w.gvr.Resource, err)
	}
	w.lastErr = err
}

// Start runs the watches, and the probe if Options.ProbeInterval is set,
// until ctx ends. It returns at once.
func (c *Cluster) Start(ctx context.Context) {
	for _, w := range c.sources {
		go w.ctrl.RunWithContext(ctx)
	}
	if c.opts.ProbeInterval > 0 {
		c.probing.Go(func() { c.probeLoop(ctx, c.opts.ProbeInterval, c.probe) })
	}
}

// WaitForSync blocks until every watch has stored its initial list or ctx
// ends, and reports whether they all did.
func (c *Cluster) WaitForSync(ctx context.Context) bool {
	fns := make([]cache.InformerSynced, len(c.sources))
	for i, w := range c.sources {
		fns[i] = w.ctrl.HasSynced
	}
	return cache.WaitForCacheSync(ctx.Done(), fns...)
}

// Snapshot implements inventory.Source from the Index. Synced is read
// before the Index: a DeltaFIFO reports synced only once the last object
// of its initial list is in the store, so a synced snapshot holds it.
func (c *Cluster) Snapshot(context.Context) inventory.Snapshot {
	synced := true
	var errs []error
	for _, w := range c.sources {
		synced = synced && w.ctrl.HasSynced()
		w.mu.Lock()
		if w.lastErr != nil {
			errs = append(errs, w.lastErr)
		}
		w.mu.Unlock()
	}
	return c.index.Snapshot(synced, errors.Join(errs...))
}

// cachedObject is what the watches queue: a trimmed inventory.Object with
// just enough metadata for the queue's keys. The Index keeps only the
// inventory.Object.
type cachedObject struct {
	metav1.TypeMeta
	metav1.ObjectMeta
	Object inventory.Object
}

func (o *cachedObject) DeepCopyObject() runtime.Object {
	c := *o
	c.ObjectMeta = *o.DeepCopy()
	c.Object.Identities = append(c.Object.Identities[:0:0], o.Object.Identities...)
	return &c
}
