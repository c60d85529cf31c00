// Package kubeinventory reads the inventory from the API server: shared
// informers over VPCAttachments and BGPAdvertisements in all namespaces, and
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

// Cluster reads the inventory from the API server through shared informers
// over VPCAttachments and BGPAdvertisements in all namespaces. After the
// initial list, it follows watches: a Snapshot makes no API request. Objects
// are trimmed to an inventory.Object before they are cached, to bound memory.
type Cluster struct {
	log     *slog.Logger
	sources []*watched

	// host and http serve consistent reads (Prove), outside the informers.
	host   string
	http   *http.Client
	proven atomic.Int64 // unix nanoseconds of the last successful Prove
}

// watched is one informer and the health of its list/watch calls.
type watched struct {
	gvr        schema.GroupVersionResource
	informer   cache.SharedIndexInformer
	fromFields func(namespace, name, vpc, attachment string) inventory.Object

	// seen is when the informer last heard from the API server (unix
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
	c := &Cluster{log: log, host: strings.TrimSuffix(cfg.Host, "/"), http: hc}
	for _, r := range []struct {
		gvr        schema.GroupVersionResource
		fromFields func(namespace, name, vpc, attachment string) inventory.Object
	}{
		{AttachmentResource, inventory.AttachmentObject},
		{AdvertisementResource, func(namespace, name, _, _ string) inventory.Object {
			return inventory.AdvertisementObject(namespace, name)
		}},
	} {
		w, err := newWatched(dc.Resource(r.gvr), r.gvr, r.fromFields, log)
		if err != nil {
			return nil, err
		}
		c.sources = append(c.sources, w)
	}
	return c, nil
}

func newWatched(ri dynamic.NamespaceableResourceInterface, gvr schema.GroupVersionResource, fromFields func(namespace, name, vpc, attachment string) inventory.Object, log *slog.Logger) (*watched, error) {
	w := &watched{gvr: gvr, fromFields: fromFields}
	trim := func(u *unstructured.Unstructured) inventory.Object {
		vpc, _, _ := unstructured.NestedString(u.Object, "status", "vpc")
		att, _, _ := unstructured.NestedString(u.Object, "status", "vpcAttachment")
		return fromFields(u.GetNamespace(), u.GetName(), vpc, att)
	}
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
	w.informer = cache.NewSharedIndexInformerWithOptions(lw, &unstructured.Unstructured{}, cache.SharedIndexInformerOptions{ObjectDescription: gvr.Resource})
	if err := w.informer.SetTransform(func(obj any) (any, error) {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			return &cachedObject{ObjectMeta: metav1.ObjectMeta{
				Name: u.GetName(), Namespace: u.GetNamespace(), ResourceVersion: u.GetResourceVersion(), UID: u.GetUID(),
			}, Object: trim(u)}, nil
		}
		return obj, nil // tombstones and already trimmed objects
	}); err != nil {
		return nil, fmt.Errorf("inventory: %s transform: %w", gvr.Resource, err)
	}
	if err := w.informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		w.record(err, log)
	}); err != nil {
		return nil, fmt.Errorf("inventory: %s error handler: %w", gvr.Resource, err)
	}
	return w, nil
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

// Start runs the informers until ctx ends. It returns at once.
func (c *Cluster) Start(ctx context.Context) {
	for _, w := range c.sources {
		go w.informer.RunWithContext(ctx)
	}
}

// WaitForSync blocks until every informer has synced or ctx ends, and
// reports whether they synced.
func (c *Cluster) WaitForSync(ctx context.Context) bool {
	fns := make([]cache.InformerSynced, len(c.sources))
	for i, w := range c.sources {
		fns[i] = w.informer.HasSynced
	}
	return cache.WaitForCacheSync(ctx.Done(), fns...)
}

// Snapshot implements inventory.Source from the informers' caches.
func (c *Cluster) Snapshot(context.Context) inventory.Snapshot {
	synced := true
	var errs []error
	var objects []inventory.Object
	for _, w := range c.sources {
		synced = synced && w.informer.HasSynced()
		w.mu.Lock()
		if w.lastErr != nil {
			errs = append(errs, w.lastErr)
		}
		w.mu.Unlock()
		for _, item := range w.informer.GetStore().List() {
			if co, ok := item.(*cachedObject); ok {
				objects = append(objects, co.Object)
			}
		}
	}
	return inventory.NewSnapshot(objects, synced, errors.Join(errs...))
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

// cachedObject is what the informers store: a trimmed inventory.Object with
// just enough metadata for the cache's keys.
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
