package hubctl

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// The address service's classes and pools, cluster-scoped in ipam
// (pkg/apis/ipam/v1alpha1/types.go: scope=Cluster).
var (
	ClassResource = schema.GroupVersionResource{Group: "ipam.miloapis.com", Version: "v1alpha1", Resource: "ipclasses"}
	PoolResource  = schema.GroupVersionResource{Group: "ipam.miloapis.com", Version: "v1alpha1", Resource: "ippools"}
)

// AnnotationDefaultClass marks ipam's default class of a family
// (internal/allocator/class.go, LoadDefaultClass): the class a claim that
// names none is given.
const AnnotationDefaultClass = "ipam.miloapis.com/is-default-class"

// DefaultMinRetentionLease is the shortest retention lease under which the
// hub releases claims by default: a week (docs/operations.md, "Retention
// leases", gives the sum it must exceed).
const DefaultMinRetentionLease = 7 * 24 * time.Hour

// RetentionLease is how long the address service keeps a retained block
// after its claim is deleted. ipam marks such an allocation Expiring once
// the lease has passed and frees its block for reissue a grace later (24 h,
// or the lease if shorter: internal/allocator/sweep.go, graceFor), so a
// block is not reissued before Lease has passed since its claim went.
type RetentionLease struct {
	// Set: the service has a lease for the claims. Unset, a retained
	// block is never reissued.
	Set   bool
	Lease time.Duration
	// From names the class or pool whose setting it is.
	From string
}

func (l RetentionLease) String() string {
	if !l.Set {
		return "none: a retained block is never reissued"
	}
	return fmt.Sprintf("%s (%s): a retained block is not reissued before %s after its claim is released, plus the service's grace", l.Lease, l.From, l.Lease)
}

// LeaseSource reports the retention lease that applies to the hub's
// claims, as last read; an error when it cannot be known.
type LeaseSource interface {
	RetentionLease() (RetentionLease, error)
}

// ErrReleasesHeld: no claim is released while the retention lease is
// shorter than the floor or cannot be read; the claims stay (and their
// quota units with them) until it is long enough.
var ErrReleasesHeld = errors.New("releases held")

// releaseHold is why no claim may be released now, or nil. Each change is
// logged, counted and recorded once.
func (c *Controller) releaseHold(ctx context.Context) error {
	// Decided and recorded under one hold of the lock, so that an older
	// reason never overwrites a newer one.
	c.mu.Lock()
	why := c.holdReason()
	changed := why != c.held
	c.held = why
	if changed && c.metrics != nil {
		c.metrics.held.Set(boolGauge(why != ""))
	}
	c.mu.Unlock()
	if changed {
		c.reportHold(ctx, why)
	}
	if why == "" {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrReleasesHeld, why)
}

func (c *Controller) holdReason() string {
	if c.cfg.Leases == nil {
		return ""
	}
	l, err := c.cfg.Leases.RetentionLease()
	switch {
	case err != nil:
		return fmt.Sprintf("the address service's retention lease cannot be read (%v), so nothing says how long a released block stays retained", err)
	case l.Set && l.Lease < c.cfg.MinRetentionLease:
		return fmt.Sprintf("the retention lease %s (%s) is shorter than the floor %s: a released block could be reissued while a node or location still carries its fabric identity",
			l.Lease, l.From, c.cfg.MinRetentionLease)
	}
	return ""
}

func (c *Controller) reportHold(ctx context.Context, why string) {
	if why == "" {
		c.log.Info("releases resume", "retention_lease", c.promise())
		c.api.HubEvent(ctx, false, "FabricIdentityReleasesResumed", "releases resume: "+c.promise())
		return
	}
	c.log.Error("releasing no claim", "why", why, "min_retention_lease", c.cfg.MinRetentionLease)
	c.api.HubEvent(ctx, true, "FabricIdentityReleasesHeld", "releasing no claim of a gone network: "+why)
}

// promise is what the hub promises of a released block now.
func (c *Controller) promise() string {
	if c.cfg.Leases == nil {
		return RetentionLease{}.String()
	}
	l, err := c.cfg.Leases.RetentionLease()
	if err != nil {
		return "unknown: " + err.Error()
	}
	return l.String()
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// EffectiveLease is the retention lease of claims of class className (""
// for the default IPv6 class) among classes and pools as the API serves
// them, the way ipam computes it (internal/allocator/lease.go,
// EffectiveLease): the lesser of the class's spec.retentionLease and its
// pool's spec.maxRetentionLease, none when both are unset. A claim may be
// drawn from any pool that offers the class (spec.classNames, which names
// the root of the class's spec.parentClassName chain), so the hub takes
// the shortest over all of them. No class in view, or a class it cannot
// find, is an error: ipam hands out no block without a class, so an empty
// list is a read that cannot see them (ipam keeps classes in the platform
// project and answers an unscoped read with an empty list), not a service
// without leases.
func EffectiveLease(classes, pools []unstructured.Unstructured, className string) (RetentionLease, error) {
	if len(classes) == 0 {
		return RetentionLease{}, errors.New("the address service serves ipclasses but none is in view: are the credentials scoped to the platform project?")
	}
	byName := map[string]*unstructured.Unstructured{}
	for i := range classes {
		byName[classes[i].GetName()] = &classes[i]
	}
	class := byName[className]
	if className == "" {
		for i := range classes {
			family, _, _ := unstructured.NestedString(classes[i].Object, "spec", "ipFamily")
			if classes[i].GetAnnotations()[AnnotationDefaultClass] == "true" && family == "IPv6" {
				class = &classes[i]
				break
			}
		}
		if class == nil {
			return RetentionLease{}, errors.New("no default IPv6 class (annotation " + AnnotationDefaultClass + ")")
		}
	}
	if class == nil {
		return RetentionLease{}, fmt.Errorf("class %q not found", className)
	}
	var best RetentionLease
	consider := func(obj *unstructured.Unstructured, field, what string) error {
		s, found, _ := unstructured.NestedString(obj.Object, "spec", field)
		if !found || s == "" {
			return nil
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("%s %s spec.%s %q: %w", what, obj.GetName(), field, s, err)
		}
		if !best.Set || d < best.Lease {
			best = RetentionLease{Set: true, Lease: d, From: what + " " + obj.GetName()}
		}
		return nil
	}
	if err := consider(class, "retentionLease", "class"); err != nil {
		return RetentionLease{}, err
	}
	// The chain to the root class, whose name pools volunteer for.
	offered := []string{class.GetName()}
	for cur, seen := class, map[string]bool{class.GetName(): true}; ; {
		parent, _, _ := unstructured.NestedString(cur.Object, "spec", "parentClassName")
		if parent == "" || seen[parent] || byName[parent] == nil {
			break
		}
		seen[parent] = true
		offered = append(offered, parent)
		cur = byName[parent]
	}
	for i := range pools {
		names, _, _ := unstructured.NestedStringSlice(pools[i].Object, "spec", "classNames")
		if !slices.ContainsFunc(offered, func(n string) bool { return slices.Contains(names, n) }) {
			continue
		}
		if err := consider(&pools[i], "maxRetentionLease", "pool"); err != nil {
			return RetentionLease{}, err
		}
	}
	return best, nil
}

// LeaseWatcher reads the retention lease of the hub's claims from the API
// server (Refresh), then every Interval (Run: a change of class or pool is
// seen within it), and is the controller's LeaseSource. Until the first
// read it reports an error, which holds releases.
type LeaseWatcher struct {
	dyn       dynamic.Interface
	className string
	metrics   *Metrics
	// Interval between reads; DefaultLeaseInterval when 0.
	Interval time.Duration

	mu    sync.Mutex
	read  bool
	lease RetentionLease
	err   error
}

// leaseReadTimeout bounds each read of the lease: a read that hangs is an
// error, which holds releases, and not a last good lease kept for ever.
const leaseReadTimeout = 10 * time.Second

// DefaultLeaseInterval: two LISTs of small cluster-scoped objects a
// minute, and a lease shortened under the floor holds releases within a
// minute of the change.
const DefaultLeaseInterval = 30 * time.Second

// NewLeaseWatcher returns a LeaseWatcher for claims of className.
func NewLeaseWatcher(dyn dynamic.Interface, className string, metrics *Metrics) *LeaseWatcher {
	return &LeaseWatcher{dyn: dyn, className: className, metrics: metrics}
}

// errNotRead: the lease has not been read yet.
var errNotRead = errors.New("not read yet")

// RetentionLease implements LeaseSource.
func (w *LeaseWatcher) RetentionLease() (RetentionLease, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.read {
		return RetentionLease{}, errNotRead
	}
	return w.lease, w.err
}

// Refresh reads the lease once. A server that does not serve ipclasses at
// all (404 for the resource: the seed's address service, a lab without
// ipam) has no leases: none.
func (w *LeaseWatcher) Refresh(ctx context.Context) error {
	lease, err := w.readLease(ctx)
	w.mu.Lock()
	w.read, w.lease, w.err = true, lease, err
	w.mu.Unlock()
	if w.metrics != nil {
		seconds := 0.0
		if err == nil && lease.Set {
			seconds = lease.Lease.Seconds()
		}
		w.metrics.lease.Set(seconds)
		w.metrics.leaseKnown.Set(boolGauge(err == nil))
	}
	return err
}

func (w *LeaseWatcher) readLease(ctx context.Context) (RetentionLease, error) {
	classes, err := w.dyn.Resource(ClassResource).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return RetentionLease{}, nil
	}
	if err != nil {
		return RetentionLease{}, fmt.Errorf("list ipclasses: %w", err)
	}
	pools, err := w.dyn.Resource(PoolResource).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		pools = &unstructured.UnstructuredList{}
	} else if err != nil {
		return RetentionLease{}, fmt.Errorf("list ippools: %w", err)
	}
	return EffectiveLease(classes.Items, pools.Items, w.className)
}

// Run reads the lease every Interval until ctx ends, calling changed
// with each lease (or error) that differs from the one before; call
// Refresh once first, so that the controller starts on a lease read.
func (w *LeaseWatcher) Run(ctx context.Context, changed func(RetentionLease, error)) {
	interval := w.Interval
	if interval <= 0 {
		interval = DefaultLeaseInterval
	}
	last := w.describe()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
		rctx, cancel := context.WithTimeout(ctx, leaseReadTimeout)
		err := w.Refresh(rctx)
		cancel()
		if now := w.describe(); now != last && changed != nil {
			l, _ := w.RetentionLease()
			changed(l, err)
			last = now
		}
	}
}

// describe is the last read, as a string to compare.
func (w *LeaseWatcher) describe() string {
	l, err := w.RetentionLease()
	if err != nil {
		return "error: " + err.Error()
	}
	return l.String()
}
