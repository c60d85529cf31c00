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
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
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
	log     *slog.Logger
	index   *inventory.Index
	sources []*watched

	// host and http serve consistent reads (Prove), outside the watches.
	host   string
	http   *http.Client
	proven atomic.Int64 // unix nanoseconds of the last successful Prove
}

// watched is one resource's watch and the health of its list/watch calls.
type watched struct {
	gvr        schema.GroupVersionResource
	kind       string
	ctrl       cache.Controller
	fromFields func(namespace, name, vpc, attachment string) inventory.Object

	// seen is when the watch last heard from the API server (unix
	// nanoseconds): a list, or any watch event, bookmarks included.
	seen atomic.Int64

	mu      sync.Mutex
	lastErr error
}

// NewCluster prepares informers over cfg; Start runs them.
func NewCluster(cfg *rest.Config, log *slog.Logger) (*Cluster, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("inventory: client: %w", err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("inventory: http client: %w", err)
	}
	c := &Cluster{log: log, index: inventory.NewIndex(), host: strings.TrimSuffix(cfg.Host, "/"), http: hc}
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
			if err == nil {
				w.seen.Store(time.Now().UnixNano())
			}
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			wi, err := ri.Namespace(metav1.NamespaceAll).Watch(ctx, opts)
			w.record(err, log)
			if err != nil {
				return nil, err
			}
			return newSeenWatch(wi, &w.seen), nil
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

// Start runs the watches until ctx ends. It returns at once.
func (c *Cluster) Start(ctx context.Context) {
	for _, w := range c.sources {
		go w.ctrl.RunWithContext(ctx)
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

// seenWatch passes a watch's events on and notes when each arrived: a
// watch that hangs, as in a network partition, delivers nothing, not even
// the API server's periodic bookmarks, and so stops proving the cache
// current.
type seenWatch struct {
	watch.Interface
	out  chan watch.Event
	stop chan struct{}
	once sync.Once
}

func newSeenWatch(in watch.Interface, seen *atomic.Int64) *seenWatch {
	s := &seenWatch{Interface: in, out: make(chan watch.Event), stop: make(chan struct{})}
	go func() {
		defer close(s.out)
		for ev := range in.ResultChan() {
			seen.Store(time.Now().UnixNano())
			select {
			case s.out <- ev:
			case <-s.stop:
				return
			}
		}
	}()
	return s
}

func (s *seenWatch) ResultChan() <-chan watch.Event { return s.out }

func (s *seenWatch) Stop() {
	s.once.Do(func() { close(s.stop) })
	s.Interface.Stop()
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
