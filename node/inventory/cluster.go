package inventory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Resources read by the cluster source.
var (
	AttachmentResource    = schema.GroupVersionResource{Group: "cloud.datumapis.com", Version: "v1alpha1", Resource: "vpcattachments"}
	AdvertisementResource = schema.GroupVersionResource{Group: "network.datumapis.com", Version: "v1alpha1", Resource: "bgpadvertisements"}
)

// Cluster reads the inventory from the API server through shared informers
// over VPCAttachments and BGPAdvertisements in all namespaces. After the
// initial list, it follows watches: a Snapshot makes no API request. Objects
// are trimmed to an Object before they are cached, to bound memory.
type Cluster struct {
	log     *slog.Logger
	sources []*watched
}

// watched is one informer and the health of its list/watch calls.
type watched struct {
	gvr      schema.GroupVersionResource
	informer cache.SharedIndexInformer

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
	c := &Cluster{log: log}
	for _, r := range []struct {
		gvr  schema.GroupVersionResource
		trim func(*unstructured.Unstructured) Object
	}{
		{AttachmentResource, func(u *unstructured.Unstructured) Object {
			vpc, _, _ := unstructured.NestedString(u.Object, "status", "vpc")
			att, _, _ := unstructured.NestedString(u.Object, "status", "vpcAttachment")
			return AttachmentObject(u.GetNamespace(), u.GetName(), vpc, att)
		}},
		{AdvertisementResource, func(u *unstructured.Unstructured) Object {
			return AdvertisementObject(u.GetNamespace(), u.GetName())
		}},
	} {
		w, err := newWatched(dc.Resource(r.gvr), r.gvr, r.trim, log)
		if err != nil {
			return nil, err
		}
		c.sources = append(c.sources, w)
	}
	return c, nil
}

func newWatched(ri dynamic.NamespaceableResourceInterface, gvr schema.GroupVersionResource, trim func(*unstructured.Unstructured) Object, log *slog.Logger) (*watched, error) {
	w := &watched{gvr: gvr}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			list, err := ri.Namespace(metav1.NamespaceAll).List(ctx, opts)
			w.record(err, log)
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			wi, err := ri.Namespace(metav1.NamespaceAll).Watch(ctx, opts)
			w.record(err, log)
			return wi, err
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

// Snapshot implements Source from the informers' caches.
func (c *Cluster) Snapshot(context.Context) Snapshot {
	synced := true
	var errs []error
	var objects []Object
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
	return build(objects, synced, errors.Join(errs...))
}

// cachedObject is what the informers store: a trimmed Object with just
// enough metadata for the cache's keys.
type cachedObject struct {
	metav1.TypeMeta
	metav1.ObjectMeta
	Object Object
}

func (o *cachedObject) DeepCopyObject() runtime.Object {
	c := *o
	c.ObjectMeta = *o.DeepCopy()
	c.Object.Identities = append(c.Object.Identities[:0:0], o.Object.Identities...)
	return &c
}
