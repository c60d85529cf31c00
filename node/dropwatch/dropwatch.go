// Package dropwatch keeps the datapath's sampled records of dropped frames
// for operators, as `hubble observe --verdict DROPPED` and `cilium-dbg
// monitor --type drop` show theirs: the newest records in memory for a look
// back, and a live feed for followers.
//
// The program writes the records into a ring buffer, rate limited per tap
// in the kernel; one reader (the Source) drains it whether or not anyone
// follows, so the ring does not fill while nobody looks. A follower that
// reads slower than drops arrive misses records instead of slowing the
// reader or the others: the next record it gets says how many it missed.
//
// What survives: nothing here. The records in memory go with the daemon;
// the program keeps writing while no daemon reads, and what the ring cannot
// hold then is counted as lost by the program (the datapath's counter).
package dropwatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Record is one dropped frame as an operator reads it. Addresses and ports
// are those of the frame's first bytes as the program captured them; a
// field the frame does not have is empty or zero.
type Record struct {
	Time    time.Time `json:"time"`
	Tap     string    `json:"tap"` // "" when no link has the ifindex any more
	Ifindex uint32    `json:"ifindex"`
	// VPC and Attachment are the identity the tap is registered with
	// (base62); empty for a frame dropped because its tap had no rules.
	VPC        string `json:"vpc,omitempty"`
	Attachment string `json:"attachment,omitempty"`
	// Decision is why it was dropped: deny, malformed, spoofed, or
	// policy_unavailable (no rules for the tap).
	Decision string `json:"decision"`
	// Rule is the number of the rule of docs/datapath.md ("How a frame is
	// judged") that decided, RuleName its title.
	Rule      uint8  `json:"rule"`
	RuleName  string `json:"ruleName"`
	Length    uint32 `json:"length"`
	SrcMAC    string `json:"srcMAC,omitempty"`
	DstMAC    string `json:"dstMAC,omitempty"`
	EtherType string `json:"etherType,omitempty"` // e.g. "ipv4", "arp", "0x88cc"
	SrcIP     string `json:"srcIP,omitempty"`
	DstIP     string `json:"dstIP,omitempty"`
	Protocol  string `json:"protocol,omitempty"` // e.g. "udp", "icmpv6", "132"
	SrcPort   uint16 `json:"srcPort,omitempty"`
	DstPort   uint16 `json:"dstPort,omitempty"`
	ICMPType  *uint8 `json:"icmpType,omitempty"`
	ICMPCode  *uint8 `json:"icmpCode,omitempty"`
	// MissedBefore is how many records this follower missed just before
	// this one because it read too slowly; 0 in a look back.
	MissedBefore uint64 `json:"missedBefore,omitempty"`
}

// Source yields records as the program writes them. Next blocks until one
// arrives; after Close it returns an error wrapping ErrClosed.
type Source interface {
	Next() (Record, error)
	Close() error
}

// ErrClosed: the source was closed.
var ErrClosed = errors.New("drop record source closed")

// ErrTooManyFollowers: Follow is refused while MaxFollowers follow.
var ErrTooManyFollowers = errors.New("too many drop followers")

// Defaults of Config.
const (
	DefaultKeep           = 1024
	DefaultMaxFollowers   = 8
	DefaultFollowerBuffer = 256
)

// Config configures a Watch.
type Config struct {
	Source Source
	// Keep is how many of the newest records are kept for a look back
	// (DefaultKeep when 0): about 400 bytes each.
	Keep int
	// MaxFollowers bounds the live feeds (DefaultMaxFollowers when 0):
	// each holds FollowerBuffer records at most.
	MaxFollowers   int
	FollowerBuffer int
	Log            *slog.Logger
}

// Watch reads a Source and serves what it read.
type Watch struct {
	cfg Config
	log *slog.Logger

	mu        sync.Mutex
	kept      []Record // a ring: next is where the next record goes
	next      int
	full      bool
	followers map[*Follower]struct{}

	read, missed atomic.Uint64
}

// New returns a Watch of cfg.Source; Run reads it.
func New(cfg Config) *Watch {
	if cfg.Keep <= 0 {
		cfg.Keep = DefaultKeep
	}
	if cfg.MaxFollowers <= 0 {
		cfg.MaxFollowers = DefaultMaxFollowers
	}
	if cfg.FollowerBuffer <= 0 {
		cfg.FollowerBuffer = DefaultFollowerBuffer
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Watch{cfg: cfg, log: cfg.Log, kept: make([]Record, cfg.Keep), followers: map[*Follower]struct{}{}}
}

// Run reads records until ctx is done, then closes the source and every
// follower's feed. It returns nil when ctx ended it, or the source's error.
func (w *Watch) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { _ = w.cfg.Source.Close() })
	defer stop()
	defer w.closeFollowers()
	for {
		r, err := w.cfg.Source.Next()
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, ErrClosed) {
				return nil
			}
			return fmt.Errorf("read drop records: %w", err)
		}
		w.add(r)
	}
}

func (w *Watch) add(r Record) {
	w.read.Add(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.kept[w.next] = r
	w.next = (w.next + 1) % len(w.kept)
	w.full = w.full || w.next == 0
	for f := range w.followers {
		f.offer(r, &w.missed)
	}
}

// Filter selects records: of one tap (by name) when Tap is set, at most
// Limit of the newest when Limit > 0.
type Filter struct {
	Tap   string
	Limit int
}

func (f Filter) matches(r Record) bool { return f.Tap == "" || r.Tap == f.Tap }

// Recent returns the kept records f selects, oldest first.
func (w *Watch) Recent(f Filter) []Record {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ordered []Record
	if w.full {
		ordered = append(ordered, w.kept[w.next:]...)
	}
	ordered = append(ordered, w.kept[:w.next]...)
	out := []Record{}
	for _, r := range ordered {
		if f.matches(r) {
			out = append(out, r)
		}
	}
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[len(out)-f.Limit:]
	}
	return out
}

// Follow starts a live feed of the records f selects (Limit does not
// apply), from now on. The caller must Close it.
func (w *Watch) Follow(f Filter) (*Follower, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.followers == nil {
		return nil, fmt.Errorf("follow drops: %w", ErrClosed)
	}
	if len(w.followers) >= w.cfg.MaxFollowers {
		return nil, fmt.Errorf("follow drops: %w (%d follow already)", ErrTooManyFollowers, len(w.followers))
	}
	fl := &Follower{w: w, filter: f, c: make(chan Record, w.cfg.FollowerBuffer)}
	w.followers[fl] = struct{}{}
	return fl, nil
}

func (w *Watch) closeFollowers() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for f := range w.followers {
		close(f.c)
	}
	w.followers = nil
}

// Stats are the Watch's counts since it started.
type Stats struct {
	Read      uint64 // records read from the source
	Missed    uint64 // records followers missed by reading too slowly
	Followers int    // live feeds now
}

// Stats returns the Watch's counts.
func (w *Watch) Stats() Stats {
	w.mu.Lock()
	n := len(w.followers)
	w.mu.Unlock()
	return Stats{Read: w.read.Load(), Missed: w.missed.Load(), Followers: n}
}

// Follower is one live feed.
type Follower struct {
	w      *Watch
	filter Filter
	c      chan Record
	missed uint64 // guarded by w.mu
	closed bool   // guarded by w.mu
}

// offer hands r to the feed without waiting (w.mu held): a full feed
// misses it.
func (f *Follower) offer(r Record, missedTotal *atomic.Uint64) {
	if !f.filter.matches(r) {
		return
	}
	r.MissedBefore = f.missed
	select {
	case f.c <- r:
		f.missed = 0
	default:
		f.missed++
		missedTotal.Add(1)
	}
}

// Records is the feed; it is closed when the Watch stops.
func (f *Follower) Records() <-chan Record { return f.c }

// Close ends the feed.
func (f *Follower) Close() {
	f.w.mu.Lock()
	defer f.w.mu.Unlock()
	if f.closed || f.w.followers == nil {
		return
	}
	f.closed = true
	delete(f.w.followers, f)
}
