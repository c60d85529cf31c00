// Package connlimit bounds the connections a listener keeps open: at most
// Total at once, and at most PerSource from one remote IP address. A
// connection over either bound is closed as soon as it is accepted, before
// a byte of it is read, so a flood costs the process a file descriptor for
// an instant and no memory; clients at other addresses are still served
// while one address floods.
//
// A unix socket's peers have no address: only Total bounds them.
//
// Connections from the host itself (a loopback peer, or a peer whose
// address is the one it reached, as the kubelet's probes of a host-network
// pod are) can be given slots of their own (Self): remote peers that fill
// Total then cannot starve the node's own probes.
package connlimit

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Limits bounds a listener's open connections.
type Limits struct {
	Total     int // open connections at once; 0 means no bound
	PerSource int // open connections from one IP address; 0 means no bound; not applied to peers without one
	// Self, when above 0, is the bound of connections from the host
	// itself, which then share one source and do not count in Total.
	Self int
}

// Listener is a net.Listener that refuses connections over its Limits.
type Listener struct {
	net.Listener
	limits Limits
	name   string
	log    *slog.Logger

	mu       sync.Mutex
	open     int
	bySource map[string]int
	lastWarn time.Time

	refused atomic.Uint64
}

// New wraps l. name says which listener it is in the log, which notes at
// most once a minute that connections are being refused.
func New(l net.Listener, limits Limits, name string, log *slog.Logger) *Listener {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Listener{Listener: l, limits: limits, name: name, log: log, bySource: map[string]int{}}
}

// Accept returns the next connection within the limits, closing every one
// over them.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := l.source(c)
		if l.take(src) {
			return &conn{Conn: c, release: func() { l.release(src) }}, nil
		}
		l.refused.Add(1)
		c.Close()
	}
}

// Open is the number of connections open now.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Refused is the number of connections closed for being over the limits.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

// self is the source of connections from the host itself, when
// Limits.Self sets them apart.
const self = "self"

func (l *Listener) take(src string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	var over bool
	switch src {
	case self:
		over = l.bySource[self] >= l.limits.Self
	case "":
		over = l.limits.Total > 0 && l.open-l.bySource[self] >= l.limits.Total
	default:
		over = (l.limits.Total > 0 && l.open-l.bySource[self] >= l.limits.Total) ||
			(l.limits.PerSource > 0 && l.bySource[src] >= l.limits.PerSource)
	}
	if over {
		if now := time.Now(); now.Sub(l.lastWarn) >= time.Minute {
			l.lastWarn = now
			l.log.Warn("connection limit reached: refusing connections", "listener", l.name,
				"open", l.open, "max", l.limits.Total, "max_per_source", l.limits.PerSource)
		}
		return false
	}
	l.open++
	l.bySource[src]++
	return true
}

func (l *Listener) release(src string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.bySource[src]--; l.bySource[src] <= 0 {
		delete(l.bySource, src)
	}
}

// source is what c's peer is bounded as: self for the host itself when
// Limits.Self is set, its IP address for another TCP peer, or "" for a peer
// without one.
func (l *Listener) source(c net.Conn) string {
	remote, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return ""
	}
	if l.limits.Self > 0 {
		if local, ok := c.LocalAddr().(*net.TCPAddr); remote.IP.IsLoopback() || ok && local.IP.Equal(remote.IP) {
			return self
		}
	}
	return remote.IP.String()
}

// conn gives its slot back once, on the first Close.
type conn struct {
	net.Conn
	once    sync.Once
	release func()
}

// NetConn returns the connection underneath, as tls.Conn's does: the admin
// API reads a unix socket's peer credentials from it.
func (c *conn) NetConn() net.Conn { return c.Conn }

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
