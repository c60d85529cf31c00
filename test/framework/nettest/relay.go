package nettest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Relay is a TCP relay that holds back what the target sends: a slow API
// server, or a slow link to it, as the client sees it. It works below TLS,
// which passes through untouched.
type Relay struct {
	delay func() time.Duration
	held  atomic.Int64
	stop  chan struct{} // closed when the test ends

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// Held is how many bytes the relay has read from the target and not yet
// passed on: nonzero while an answer is being held back. A test that knows
// what else flows (an answer far larger than the rest) tells by it that an
// answer is in flight, without timing it.
func (r *Relay) Held() int64 { return r.held.Load() }

// ForwardDelayed is Forward holding back every byte from target to the
// client by delay(), in order: each chunk read from the target is passed on
// once delay() has passed since it was read. delay is asked again while a
// chunk waits, so a test may change it at run time: a shorter delay lets
// through at once what has waited longer. What the client sends passes at
// once. It stops when t ends, closing every connection.
func ForwardDelayed(t testing.TB, ns *NS, listenAddr, target string, delay func() time.Duration) *Relay {
	t.Helper()
	r := &Relay{delay: delay, stop: make(chan struct{}), conns: make(map[net.Conn]struct{})}
	l := listenIn(t, ns, listenAddr)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		l.Close()
		close(r.stop)
		r.mu.Lock()
		for c := range r.conns {
			c.Close()
		}
		r.conns = nil
		r.mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { r.serve(in, target) })
		}
	})
	return r
}

// track keeps c to close when the test ends; false once it has ended.
func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conns == nil {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Relay) untrack(c net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.conns, c)
}

// chunk is what one read from the target returned, and when.
type chunk struct {
	data []byte
	at   time.Time
}

func (r *Relay) serve(in net.Conn, target string) {
	defer in.Close()
	if !r.track(in) {
		return
	}
	defer r.untrack(in)
	out, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer out.Close()
	if !r.track(out) {
		return
	}
	defer r.untrack(out)
	go func() { _, _ = io.Copy(out, in); _ = out.(*net.TCPConn).CloseWrite() }()

	// A reader that never waits (the target is never slowed by the client)
	// and a writer that passes each chunk on when it is due: an unbounded
	// queue between them. Whatever is dropped (the client gone, the test
	// over) leaves the count.
	var (
		mu     sync.Mutex
		queue  []chunk
		eof    bool
		closed bool
		ready  = make(chan struct{}, 1)
	)
	signal := func() {
		select {
		case ready <- struct{}{}:
		default:
		}
	}
	go func() {
		for {
			buf := make([]byte, 32<<10)
			n, err := out.Read(buf)
			mu.Lock()
			if n > 0 && !closed {
				r.held.Add(int64(n))
				queue = append(queue, chunk{buf[:n], time.Now()})
			}
			eof = err != nil
			mu.Unlock()
			signal()
			if err != nil {
				return
			}
		}
	}()
	drop := func() {
		mu.Lock()
		closed = true
		for _, q := range queue {
			r.held.Add(-int64(len(q.data)))
		}
		queue = nil
		mu.Unlock()
		out.Close()
	}
	for {
		mu.Lock()
		if len(queue) == 0 {
			done := eof
			mu.Unlock()
			if done {
				_ = in.(*net.TCPConn).CloseWrite()
				return
			}
			select {
			case <-ready:
			case <-r.stop:
				drop()
				return
			}
			continue
		}
		c := queue[0]
		queue = queue[1:]
		mu.Unlock()
		for wait := time.Until(c.at.Add(r.delay())); wait > 0; wait = time.Until(c.at.Add(r.delay())) {
			select {
			case <-time.After(min(wait, 20*time.Millisecond)):
			case <-r.stop:
				r.held.Add(-int64(len(c.data)))
				drop()
				return
			}
		}
		_, err := in.Write(c.data)
		r.held.Add(-int64(len(c.data)))
		if err != nil {
			drop()
			return
		}
	}
}
