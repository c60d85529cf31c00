// Package routewatch tells the datapath when the kernel's addresses or
// routes change. The program caches its route answers (is this destination
// the host's?); every address or route event read here bumps the epoch
// those answers are checked against, so that no frame is judged by an
// answer older than a change the watcher has read.
//
// It reads rtnetlink's address and route groups, IPv4 and IPv6, in one
// network namespace. It does not parse what changed: any change may move an
// address between "the host's" and "forwarded", and an epoch bump costs
// each destination one fresh lookup.
package routewatch

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Invalidator makes cached route answers stale: *datapath.Datapath.
type Invalidator interface {
	BumpRouteEpoch() (uint64, error)
}

// groups are the rtnetlink multicast groups whose events can change what the
// host receives: addresses and routes, both families.
const groups = unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_IPV6_IFADDR | unix.RTMGRP_IPV4_ROUTE | unix.RTMGRP_IPV6_ROUTE

// Watcher reads address and route events and bumps the datapath's route
// epoch for them.
type Watcher struct {
	conn *netlink.Conn
	inv  Invalidator
	log  *slog.Logger

	mu      sync.Mutex
	waiters map[uint32]chan struct{} // Sync requests by sequence number
	events  uint64
}

// Dial subscribes to address and route events in the namespace ns (nil:
// the caller's).
func Dial(ns *os.File, inv Invalidator, log *slog.Logger) (*Watcher, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg := &netlink.Config{Groups: groups}
	if ns != nil {
		cfg.NetNS = int(ns.Fd())
	}
	conn, err := netlink.Dial(unix.NETLINK_ROUTE, cfg)
	if err != nil {
		return nil, fmt.Errorf("route watch: dial rtnetlink: %w", err)
	}
	return &Watcher{conn: conn, inv: inv, log: log, waiters: map[uint32]chan struct{}{}}, nil
}

// Close stops Run and releases the socket.
func (w *Watcher) Close() error { return w.conn.Close() }

// Run reads events until ctx ends, bumping the epoch once per batch read
// that holds an address or route event. A receive buffer that overflowed
// lost events the watcher cannot name, so it bumps for them too. It returns
// nil when ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { _ = w.conn.SetReadDeadline(time.Now()) })
	defer stop()
	for {
		msgs, err := w.conn.Receive()
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, unix.ENOBUFS) {
			w.log.Warn("route events were lost (receive buffer full): every cached route answer is stale")
			if err := w.bump(); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("route watch: receive: %w", err)
		}
		changed := false
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.RTM_NEWADDR, unix.RTM_DELADDR, unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
				changed = true
			}
		}
		// Bump before waking Sync: the reply to a Sync request comes after
		// every event queued before it, possibly in this same batch.
		if changed {
			if err := w.bump(); err != nil {
				return err
			}
		}
		for _, m := range msgs {
			// Events carry the port of whoever made the change; a reply,
			// this socket's.
			if m.Header.PID == w.conn.PID() {
				w.done(m.Header.Sequence)
			}
		}
	}
}

func (w *Watcher) bump() error {
	epoch, err := w.inv.BumpRouteEpoch()
	if err != nil {
		return fmt.Errorf("route watch: %w", err)
	}
	w.mu.Lock()
	w.events++
	w.mu.Unlock()
	w.log.Debug("address or route changed: cached route answers are stale", "epoch", epoch)
	return nil
}

func (w *Watcher) done(seq uint32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c, ok := w.waiters[seq]; ok {
		close(c)
		delete(w.waiters, seq)
	}
}

// Sync returns once Run has applied every event the kernel queued before
// the call: it sends a request on the watcher's socket and waits for Run to
// read the answer, which the kernel queues behind them. Run must be running.
func (w *Watcher) Sync(ctx context.Context) error {
	// Any request answered by one message will do; the loopback's link is
	// in every namespace.
	req := netlink.Message{
		Header: netlink.Header{Type: unix.RTM_GETLINK, Flags: netlink.Request},
		Data:   ifinfomsg(1),
	}
	w.mu.Lock()
	sent, err := w.conn.Send(req)
	if err != nil {
		w.mu.Unlock()
		return fmt.Errorf("route watch: sync: %w", err)
	}
	c := make(chan struct{})
	w.waiters[sent.Header.Sequence] = c
	w.mu.Unlock()
	select {
	case <-c:
		return nil
	case <-ctx.Done():
		w.mu.Lock()
		delete(w.waiters, sent.Header.Sequence)
		w.mu.Unlock()
		return fmt.Errorf("route watch: sync: %w", ctx.Err())
	}
}

// Events is how many batches of address and route events (or overflows)
// the watcher has bumped the epoch for.
func (w *Watcher) Events() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.events
}

// ifinfomsg is a struct ifinfomsg asking for the link ifindex.
func ifinfomsg(ifindex int32) []byte {
	b := make([]byte, unix.SizeofIfInfomsg)
	b[0] = unix.AF_UNSPEC
	binary.NativeEndian.PutUint32(b[4:], uint32(ifindex))
	return b
}
