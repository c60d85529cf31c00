package connlimit_test

import (
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/internal/connlimit"
)

// serve accepts on l and holds each connection until the peer closes it,
// writing "ok" first so that a client can tell it was admitted.
func serve(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_, _ = c.Write([]byte("ok"))
			_, _ = io.Copy(io.Discard, c)
		}()
	}
}

// admitted dials addr from src and reports whether the server admitted the
// connection (said "ok") or closed it unread; admitted ones stay open.
func admitted(t *testing.T, src, addr string) (net.Conn, bool) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 2)
	if _, err := io.ReadFull(c, buf); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("the server neither admitted nor closed the connection")
		}
		return c, false
	}
	return c, true
}

// TestLimitsAreHeldPerSourceAndInTotal dials real TCP connections on
// loopback from several source addresses.
func TestLimitsAreHeldPerSourceAndInTotal(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := connlimit.New(inner, connlimit.Limits{Total: 4, PerSource: 2}, "test", nil)
	defer l.Close()
	go serve(l)
	addr := inner.Addr().String()

	a1, ok1 := admitted(t, "127.0.0.2", addr)
	_, ok2 := admitted(t, "127.0.0.2", addr)
	if _, ok := admitted(t, "127.0.0.2", addr); !ok1 || !ok2 || ok {
		t.Fatalf("one source: admitted %v %v, third %v; want two admitted and the third refused", ok1, ok2, ok)
	}
	if _, ok := admitted(t, "127.0.0.3", addr); !ok {
		t.Fatal("another source was refused while the first was at its bound")
	}
	if _, ok := admitted(t, "127.0.0.4", addr); !ok {
		t.Fatal("the fourth connection in total was refused")
	}
	if _, ok := admitted(t, "127.0.0.5", addr); ok {
		t.Fatal("a fifth connection in total was admitted")
	}
	if l.Refused() != 2 {
		t.Fatalf("refused %d, want 2", l.Refused())
	}
	a1.Close()
	deadline := time.Now().Add(10 * time.Second)
	for l.Open() != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("open %d after a client hung up, want 3", l.Open())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, ok := admitted(t, "127.0.0.2", addr); !ok {
		t.Fatal("the slot of a closed connection was not given back")
	}
}

// TestAUnixSocketIsBoundOnlyInTotal: unix peers have no address, so the
// per-source bound does not make them share a few slots.
func TestAUnixSocketIsBoundOnlyInTotal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	inner, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l := connlimit.New(inner, connlimit.Limits{Total: 3, PerSource: 1}, "test", nil)
	defer l.Close()
	go serve(l)
	for i, want := range []bool{true, true, true, false} {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = io.ReadFull(c, make([]byte, 2))
		if got := err == nil; got != want {
			t.Fatalf("connection %d admitted %v, want %v (%v)", i+1, got, want, err)
		}
	}
}

// TestTheHostHasSlotsOfItsOwn: with Self set, loopback peers are the host
// itself: bound by Self, apart from Total and PerSource.
func TestTheHostHasSlotsOfItsOwn(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := connlimit.New(inner, connlimit.Limits{Total: 10, PerSource: 10, Self: 2}, "test", nil)
	defer l.Close()
	go serve(l)
	addr := inner.Addr().String()
	_, ok1 := admitted(t, "127.0.0.2", addr)
	_, ok2 := admitted(t, "127.0.0.3", addr)
	if _, ok := admitted(t, "127.0.0.4", addr); !ok1 || !ok2 || ok {
		t.Fatalf("host peers admitted %v %v, third %v; want two, then refused", ok1, ok2, ok)
	}
}
