// Package routewatch keeps the datapath's knowledge of the host's addresses
// current. It reads rtnetlink's address and route groups, IPv4 and IPv6, in
// one network namespace, and for every batch of events:
//
//   - bumps the route epoch, so that the program's cached route answers
//     (is this destination the host's?) older than a change it has read are
//     asked again;
//   - publishes the host view: the prefixes of every local, broadcast and
//     anycast route, in every table, which the program trusts to forward any
//     other destination without a route lookup. It pushes the time the view
//     is trusted until forward while it reads every event, revokes it when
//     events were lost, and lets it lapse when the daemon stops.
//
// The datapath package holds the maps; this one holds the netlink side.
package routewatch

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Datapath is what the watcher writes to: *datapath.Datapath.
type Datapath interface {
	BumpRouteEpoch() (uint64, error)
	PublishHostView(prefixes []netip.Prefix, trustFor time.Duration) error
	RenewHostView(trustFor time.Duration) error
	RevokeHostView() error
}

// groups are the rtnetlink multicast groups whose events can change what the
// host receives: addresses and routes, both families.
const groups = unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_IPV6_IFADDR | unix.RTMGRP_IPV4_ROUTE | unix.RTMGRP_IPV6_ROUTE

// ViewTrust is how long the program trusts a published host view, and so
// how long a view outlives a watcher that stopped without revoking it (a
// killed daemon); the watcher publishes it again every ViewTrust/5.
const ViewTrust = 500 * time.Millisecond

// receiveBuffer is the watch socket's receive buffer: a burst of route
// events that overflows it costs a full route dump (resync).
const receiveBuffer = 4 << 20

// Watcher reads address and route events and writes their consequences to
// the datapath.
type Watcher struct {
	conn *netlink.Conn
	ns   *os.File
	dp   Datapath
	log  *slog.Logger

	mu      sync.Mutex
	waiters map[uint32]chan struct{} // Sync requests by sequence number
	events  uint64
	routes  map[hostRoute]struct{} // the host routes the kernel holds, as read so far
	// barrier is the sequence number of the request whose answer ends a
	// resync: events queued before it are applied, and routes then match
	// the kernel's. 0: none pending.
	barrier uint32
	trusted bool // routes match the kernel's: the view may be published
}

// Dial subscribes to address and route events in the namespace ns (nil:
// the caller's) and reads the host routes there. Subscribed before it
// reads, so that no change after the read goes unseen.
func Dial(ns *os.File, dp Datapath, log *slog.Logger) (*Watcher, error) {
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
	// Best effort: without it the kernel's default only costs resyncs.
	_ = conn.SetReadBuffer(receiveBuffer)
	w := &Watcher{conn: conn, ns: ns, dp: dp, log: log, waiters: map[uint32]chan struct{}{}}
	if err := w.resync(); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return w, nil
}

// Close stops Run and releases the socket.
func (w *Watcher) Close() error { return w.conn.Close() }

// Run reads events until ctx ends, bumping the epoch and publishing the host
// view once per batch read that holds an address or route event. A receive
// buffer that overflowed lost events the watcher cannot name: it revokes
// the view, bumps, and reads every route again. It revokes the view when it
// returns, which is nil when ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { _ = w.conn.SetReadDeadline(time.Now()) })
	defer stop()
	defer func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.trusted = false
		if err := w.dp.RevokeHostView(); err != nil {
			w.log.Error("host view not revoked: the program trusts it until it lapses", "error", err, "within", ViewTrust)
		}
	}()
	renewCtx, cancelRenew := context.WithCancel(ctx)
	defer cancelRenew()
	go w.renew(renewCtx)
	for {
		msgs, err := w.conn.Receive()
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, unix.ENOBUFS) {
			w.log.Warn("route events were lost (receive buffer full): the host view is revoked until every route is read again")
			if err := w.bump(); err != nil {
				return err
			}
			if err := w.resync(); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("route watch: receive: %w", err)
		}
		if err := w.apply(msgs); err != nil {
			return err
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

// apply applies a batch of events: the host routes they add and remove,
// the epoch bump, and the view published, all before any Sync waiting on
// this batch returns.
func (w *Watcher) apply(msgs []netlink.Message) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	changed, viewChanged := false, false
	for _, m := range msgs {
		switch m.Header.Type {
		case unix.RTM_NEWADDR, unix.RTM_DELADDR:
			changed = true
		case unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
			changed = true
			r, ok, err := parseHostRoute(m.Data)
			if err != nil {
				// A route the watcher cannot read may be the host's.
				w.log.Warn("unreadable route event: the host view is revoked until every route is read again", "error", err)
				w.trusted = false
				w.barrier = 0
				if err := w.dp.RevokeHostView(); err != nil {
					return fmt.Errorf("route watch: %w", err)
				}
				continue
			}
			if !ok {
				continue
			}
			if m.Header.Type == unix.RTM_NEWROUTE {
				w.routes[r] = struct{}{}
			} else {
				delete(w.routes, r)
			}
			viewChanged = true
		}
		if w.barrier != 0 && m.Header.PID == w.conn.PID() && m.Header.Sequence == w.barrier {
			w.barrier = 0
			w.trusted = true
			viewChanged = true
			w.log.Info("host view published: the program forwards destinations outside it without a route lookup", "host_routes", len(w.routes))
		}
	}
	if changed {
		if err := w.bumpLocked(); err != nil {
			return err
		}
	}
	if viewChanged && w.trusted {
		if err := w.dp.PublishHostView(w.prefixes(), ViewTrust); err != nil {
			return fmt.Errorf("route watch: %w", err)
		}
	}
	if !w.trusted && w.barrier == 0 {
		// An unreadable event: read every route again.
		return w.resyncLocked()
	}
	return nil
}

// renew publishes the view again before it lapses, while Run reads events.
func (w *Watcher) renew(ctx context.Context) {
	t := time.NewTicker(ViewTrust / 5)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.mu.Lock()
		if w.trusted {
			if err := w.dp.RenewHostView(ViewTrust); err != nil {
				w.log.Warn("host view not renewed: the program asks the route lookup once it lapses", "error", err)
			}
		}
		w.mu.Unlock()
	}
}

// resync revokes the view, reads every route, and sends the barrier whose
// answer, read by Run behind every event queued meanwhile, makes the view
// trusted again.
func (w *Watcher) resync() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.resyncLocked()
}

func (w *Watcher) resyncLocked() error {
	w.trusted = false
	if err := w.dp.RevokeHostView(); err != nil {
		return fmt.Errorf("route watch: %w", err)
	}
	routes, err := dumpHostRoutes(w.ns)
	if err != nil {
		return err
	}
	w.routes = routes
	sent, err := w.conn.Send(barrierRequest())
	if err != nil {
		return fmt.Errorf("route watch: resync: %w", err)
	}
	w.barrier = sent.Header.Sequence
	return nil
}

func (w *Watcher) bump() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.bumpLocked()
}

func (w *Watcher) bumpLocked() error {
	epoch, err := w.dp.BumpRouteEpoch()
	if err != nil {
		return fmt.Errorf("route watch: %w", err)
	}
	w.events++
	w.log.Debug("address or route changed: cached route answers are stale", "epoch", epoch)
	return nil
}

// prefixes are the destinations of the host routes.
func (w *Watcher) prefixes() []netip.Prefix {
	out := make([]netip.Prefix, 0, len(w.routes))
	for r := range w.routes {
		out = append(out, r.dst)
	}
	return out
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
// After Dial, a Sync that returns has also seen the host view published.
func (w *Watcher) Sync(ctx context.Context) error {
	w.mu.Lock()
	sent, err := w.conn.Send(barrierRequest())
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

// barrierRequest is a request answered by one message, queued behind every
// event before it: the loopback's link, which is in every namespace.
func barrierRequest() netlink.Message {
	b := make([]byte, unix.SizeofIfInfomsg)
	b[0] = unix.AF_UNSPEC
	binary.NativeEndian.PutUint32(b[4:], 1)
	return netlink.Message{Header: netlink.Header{Type: unix.RTM_GETLINK, Flags: netlink.Request}, Data: b}
}
