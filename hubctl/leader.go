package hubctl

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
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
// outlast the retry period with client-go's jitter.
func (t LeaseTiming) Validate() error {
	switch {
	case t.RetryPeriod <= 0:
		return fmt.Errorf("--leader-elect-retry-period %s: want above 0", t.RetryPeriod)
	case t.RenewDeadline <= time.Duration(leaderelection.JitterFactor*float64(t.RetryPeriod)):
		return fmt.Errorf("--leader-elect-renew-deadline %s: want above %v times --leader-elect-retry-period %s",
			t.RenewDeadline, leaderelection.JitterFactor, t.RetryPeriod)
	case t.Duration <= t.RenewDeadline:
		return fmt.Errorf("--leader-elect-lease-duration %s: want above --leader-elect-renew-deadline %s", t.Duration, t.RenewDeadline)
	}
	return nil
}

// DefaultLeaseTiming is client-go's usual timing, and kube-controller-manager's
// defaults for the --leader-elect-* flags.
var DefaultLeaseTiming = LeaseTiming{Duration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}

// RunAsLeader campaigns for the Lease namespace/name as id and calls lead
// with a context that ends when leadership does. It returns when ctx ends
// (releasing the Lease, so another instance takes over at once) or when
// leadership is lost; only the leader reconciles.
func RunAsLeader(ctx context.Context, cs kubernetes.Interface, namespace, name, id string, timing LeaseTiming, lead func(context.Context)) error {
	if id == "" {
		return fmt.Errorf("leader election: empty identity")
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: name},
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   timing.Duration,
		RenewDeadline:   timing.RenewDeadline,
		RetryPeriod:     timing.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: lead,
			OnStoppedLeading: func() {},
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
