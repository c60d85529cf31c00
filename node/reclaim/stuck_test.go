package reclaim

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/node/link"
)

// hangingLinks blocks every dump until released: a netlink read that never
// returns, which the real kernel cannot be made to produce on demand.
type hangingLinks struct {
	*fakeLinks
	entered chan struct{}
	release chan struct{}
}

func (h hangingLinks) Links(ctx context.Context) ([]link.Link, error) {
	h.entered <- struct{}{}
	<-h.release
	return h.fakeLinks.Links(ctx)
}

func TestAPassInFlightBeyondTheBoundIsStuck(t *testing.T) {
	hl := hangingLinks{fakeLinks: newFakeLinks(), entered: make(chan struct{}), release: make(chan struct{})}
	r := New(hl, liveInventory(), &fakeRegistry{}, &fakeLocker{}, nil, nil, Config{})
	done := make(chan struct{})
	go func() { r.Pass(context.Background(), PassOptions{}); close(done) }()
	<-hl.entered
	const after = 10 * time.Minute
	if err := r.Stuck(time.Now(), after); err != nil {
		t.Fatalf("a pass just started is stuck: %v", err)
	}
	if err := r.Stuck(time.Now().Add(after+time.Second), after); !errors.Is(err, ErrStuck) {
		t.Fatalf("a pass in flight past the bound: %v, want ErrStuck", err)
	}
	close(hl.release)
	<-done
	if err := r.Stuck(time.Now().Add(after+time.Hour), after); err != nil {
		t.Fatalf("no pass in flight and no loop, yet stuck: %v", err)
	}
}

func TestALoopThatStopsGoingRoundIsStuck(t *testing.T) {
	h := newHarness(liveInventory(), Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const interval, after = time.Hour, 10 * time.Minute
	go h.r.Run(ctx, interval)
	deadline := time.Now().Add(10 * time.Second)
	for len(h.r.Reports()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the loop ran no pass")
		}
		time.Sleep(time.Millisecond)
	}
	if err := h.r.Stuck(time.Now().Add(interval), after); err != nil {
		t.Fatalf("within its interval and the bound: %v", err)
	}
	if err := h.r.Stuck(time.Now().Add(interval+after+time.Second), after); !errors.Is(err, ErrStuck) {
		t.Fatalf("a loop that has not gone round for interval+bound: %v, want ErrStuck", err)
	}
}
