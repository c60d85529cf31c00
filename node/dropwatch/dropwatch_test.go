package dropwatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// chanSource is a fake Source fed by the test: the logic under test (the
// look back, the feeds, the misses) sits above the ring buffer, which the
// datapath's privileged tests exercise for real.
type chanSource struct {
	c    chan Record
	once sync.Once
	done chan struct{}
}

func newChanSource() *chanSource { return &chanSource{c: make(chan Record), done: make(chan struct{})} }

func (s *chanSource) Next() (Record, error) {
	select {
	case r := <-s.c:
		return r, nil
	case <-s.done:
		return Record{}, fmt.Errorf("read: %w", ErrClosed)
	}
}

func (s *chanSource) Close() error { s.once.Do(func() { close(s.done) }); return nil }

func running(t *testing.T, cfg Config) (*Watch, *chanSource, func() error) {
	t.Helper()
	src := newChanSource()
	cfg.Source = src
	w := New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- w.Run(ctx) }()
	var once sync.Once
	var err error
	stop := func() error {
		once.Do(func() { cancel(); err = <-errc })
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return w, src, stop
}

func rec(tap string, n int) Record { return Record{Tap: tap, Ifindex: uint32(n), Decision: "spoofed"} }

func TestRecentKeepsTheNewestInOrderAndFilters(t *testing.T) {
	w, src, stop := running(t, Config{Keep: 4})
	for i := 1; i <= 6; i++ {
		src.c <- rec([]string{"a", "b"}[i%2], i)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run after cancel: %v", err)
	}
	var got []uint32
	for _, r := range w.Recent(Filter{}) {
		got = append(got, r.Ifindex)
	}
	if fmt.Sprint(got) != "[3 4 5 6]" {
		t.Fatalf("Recent kept %v, want the newest 4 oldest first: [3 4 5 6]", got)
	}
	got = nil
	for _, r := range w.Recent(Filter{Tap: "a"}) {
		got = append(got, r.Ifindex)
	}
	if fmt.Sprint(got) != "[4 6]" {
		t.Fatalf("Recent of tap a: %v, want [4 6]", got)
	}
	if r := w.Recent(Filter{Limit: 1}); len(r) != 1 || r[0].Ifindex != 6 {
		t.Fatalf("Recent limit 1: %v, want the newest", r)
	}
	if st := w.Stats(); st.Read != 6 {
		t.Fatalf("Stats().Read = %d, want 6", st.Read)
	}
}

func TestAFollowerGetsNewRecordsOfItsTapAndASlowOneLearnsWhatItMissed(t *testing.T) {
	w, src, stop := running(t, Config{FollowerBuffer: 2})
	src.c <- rec("a", 1) // before the feed: not in it
	for w.Stats().Read < 1 {
		time.Sleep(time.Millisecond)
	}
	f, err := w.Follow(Filter{Tap: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := 2; i <= 6; i++ {
		src.c <- rec("a", i)
		src.c <- rec("b", 100+i) // another tap's: never in the feed
	}
	// The feed held 2 and missed 3; the next record says so.
	var got []uint32
	for range 2 {
		got = append(got, (<-f.Records()).Ifindex)
	}
	src.c <- rec("a", 7)
	last := <-f.Records()
	if fmt.Sprint(got) != "[2 3]" || last.Ifindex != 7 || last.MissedBefore != 3 {
		t.Fatalf("feed gave %v then %d missing %d, want [2 3] then 7 missing 3", got, last.Ifindex, last.MissedBefore)
	}
	if st := w.Stats(); st.Missed != 3 || st.Followers != 1 {
		t.Fatalf("Stats = %+v, want 3 missed and 1 follower", st)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-f.Records(); ok {
		t.Fatal("the feed stayed open after the Watch stopped")
	}
}

func TestFollowersAreBounded(t *testing.T) {
	w, _, _ := running(t, Config{MaxFollowers: 2})
	a, err := w.Follow(Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Follow(Filter{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Follow(Filter{}); !errors.Is(err, ErrTooManyFollowers) {
		t.Fatalf("third Follow: %v, want ErrTooManyFollowers", err)
	}
	a.Close()
	a.Close() // twice is harmless
	if _, err := w.Follow(Filter{}); err != nil {
		t.Fatalf("Follow after one closed: %v", err)
	}
}

func TestRunReportsASourceThatFails(t *testing.T) {
	src := &failing{}
	w := New(Config{Source: src})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.Run(ctx); err == nil || !errors.Is(err, errBroken) {
		t.Fatalf("Run = %v, want the source's error", err)
	}
}

var errBroken = errors.New("broken ring")

type failing struct{}

func (failing) Next() (Record, error) { return Record{}, errBroken }
func (failing) Close() error          { return nil }
