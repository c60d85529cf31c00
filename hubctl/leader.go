package hubctl

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// LeaseTiming is how long a Lease is held, renewed and retried.
type LeaseTiming struct {
	Duration, RenewDeadline, RetryPeriod time.Duration
}

// Validate refuses a timing client-go's elector would refuse, with the
// flags' names: the lease must outlast the renew deadline, which must
// outlast the retry period with client-go's jitter. It also refuses one
// under which a leader renewing on time could not write: the LeaseFence
// lets writes through for the lease, in the whole seconds the Lease
// records, less its margin, and that must outlast the retry period, the
// time between renewals.
func (t LeaseTiming) Validate() error {
	switch {
	case t.RetryPeriod <= 0:
		return fmt.Errorf("--leader-elect-retry-period %s: want above 0", t.RetryPeriod)
	case t.RenewDeadline <= time.Duration(leaderelection.JitterFactor*float64(t.RetryPeriod)):
		return fmt.Errorf("--leader-elect-renew-deadline %s: want above %v times --leader-elect-retry-period %s",
			t.RenewDeadline, leaderelection.JitterFactor, t.RetryPeriod)
	case t.Duration <= t.RenewDeadline:
		return fmt.Errorf("--leader-elect-lease-duration %s: want above --leader-elect-renew-deadline %s", t.Duration, t.RenewDeadline)
	case t.fenceWindow() <= t.RetryPeriod:
		return fmt.Errorf("--leader-elect-lease-duration %s: want its whole seconds above %s (the write fence's margin, the larger of --leader-elect-retry-period and 1 s) plus --leader-elect-retry-period %s, or a leader renewing on time could not write",
			t.Duration, fenceMargin(t), t.RetryPeriod)
	}
	return nil
}

// fenceWindow is how long after a renewal starts a LeaseFence lets writes
// through.
func (t LeaseTiming) fenceWindow() time.Duration {
	return t.Duration.Truncate(time.Second) - fenceMargin(t)
}

// DefaultLeaseTiming is kube-controller-manager's lease duration and renew
// deadline, with a retry period of 300 ms instead of its 2 s. A follower
// polls the Lease every retry period to 2.2 times it (client-go's jitter),
// so it takes over between the lease duration and that plus 4.4 retry
// periods after the last renewal: up to 8.8 s late at 2 s, and within the
// lease plus 2 s (the failover bound of issue 32) only at about 0.45 s or
// less, and 300 ms leaves room for the take-over's own requests (at 400 ms
// a failover measured 16.3 s of the 17 allowed). The cost: the leader
// renews the Lease every 300 ms (3.3 small
// writes a second) and each follower reads it about as often.
var DefaultLeaseTiming = LeaseTiming{Duration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 300 * time.Millisecond}

// LeaderOption tells RunAsLeader what else to tell of its leadership.
type LeaderOption func(*leaderOptions)

type leaderOptions struct {
	fence   *LeaseFence
	metrics *Metrics
}

// WithFence has RunAsLeader tell fence of every write of the Lease and of
// the end of leadership: the fence the leader's writes then hold (see
// LeaseFence). One fence per RunAsLeader.
func WithFence(fence *LeaseFence) LeaderOption {
	return func(o *leaderOptions) { o.fence = fence }
}

// WithMetrics has RunAsLeader set m's galactic_hub_leader: 1 from the start
// of leading to its end, so that a hub whose replicas are up but none leads
// is told apart from one with no replica up.
func WithMetrics(m *Metrics) LeaderOption {
	return func(o *leaderOptions) { o.metrics = m }
}

// RunAsLeader campaigns for the Lease namespace/name as id and calls lead
// with a context that ends when leadership does. It returns when ctx ends
// (releasing the Lease, so another instance takes over at once) or when
// leadership is lost; only the leader reconciles.
func RunAsLeader(ctx context.Context, cs kubernetes.Interface, namespace, name, id string, timing LeaseTiming, lead func(context.Context), opts ...LeaderOption) error {
	if id == "" {
		return fmt.Errorf("leader election: empty identity")
	}
	var o leaderOptions
	for _, opt := range opts {
		opt(&o)
	}
	var lock resourcelock.Interface = &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: name},
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}
	if o.fence != nil {
		lock = recordingLock{Interface: lock, fence: o.fence}
	}
	state := &leadership{fence: o.fence}
	if o.metrics != nil {
		state.gauge = o.metrics.leader
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   timing.Duration,
		RenewDeadline:   timing.RenewDeadline,
		RetryPeriod:     timing.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				state.started()
				lead(ctx)
			},
			OnStoppedLeading: state.stopped,
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	// WithSink, not logr.New: New calls Init on the sink, which klog shares
	// process-wide, so two electors in one process would race on it.
	base := klog.FromContext(ctx)
	le.Run(klog.NewContext(ctx, base.WithSink(leaseRaceIsNoError{base.GetSink()})))
	return nil
}

// leadership follows the elector's callbacks. client-go calls
// OnStartedLeading on a goroutine of its own, which may run after
// OnStoppedLeading when leadership is lost at once: a stop is final.
type leadership struct {
	fence *LeaseFence
	gauge prometheus.Gauge

	mu   sync.Mutex
	done bool
}

func (l *leadership) started() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done && l.gauge != nil {
		l.gauge.Set(1)
	}
}

func (l *leadership) stopped() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.done = true
	if l.fence != nil {
		l.fence.stop()
	}
	if l.gauge != nil {
		l.gauge.Set(0)
	}
}

// leaseRaceIsNoError logs as info what client-go's elector logs as an error
// when another instance created the Lease between this one's look-up and its
// create: replicas that start together race for it on every rollout, and
// the loser just campaigns on as a follower. An operator alerting on errors
// would be paged for a normal start.
type leaseRaceIsNoError struct{ logr.LogSink }

func (s leaseRaceIsNoError) Error(err error, msg string, kv ...any) {
	if apierrors.IsAlreadyExists(err) {
		s.Info(0, msg+": another instance created it first; campaigning on", append(kv, "err", err.Error())...)
		return
	}
	s.LogSink.Error(err, msg, kv...)
}

func (s leaseRaceIsNoError) WithValues(kv ...any) logr.LogSink {
	return leaseRaceIsNoError{s.LogSink.WithValues(kv...)}
}

func (s leaseRaceIsNoError) WithName(name string) logr.LogSink {
	return leaseRaceIsNoError{s.LogSink.WithName(name)}
}
