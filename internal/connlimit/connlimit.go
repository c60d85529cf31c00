// Package connlimit bounds the connections a listener keeps open: at most
// Total at once, and at most PerSource from one remote IP address. A
// connection over either bound is closed as soon as it is accepted, before
// a byte of it is read, so a flood costs the process a file descriptor for
// an instant and no memory; clients at other addresses are still served
// while one address floods.
//
// A unix socket's peers have no address: only Total bounds them.
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
		src := source(c.RemoteAddr())
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

func (l *Listener) take(src string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	over := (l.limits.Total > 0 && l.open >= l.limits.Total) || (src != "" && l.limits.PerSource > 0 && l.bySource[src] >= l.limits.PerSource)
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

// source is the IP address of a TCP peer, or "" for peers without one.
func source(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	return ""
}

// conn gives its slot back once, on the first Close.
type conn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
