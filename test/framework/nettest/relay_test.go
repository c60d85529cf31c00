package nettest

import (
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/node/netns"
)

// The relay holds back what the target sends, in order, for as long as
// the delay says, asked again while it waits: a delay shortened at run time
// lets through at once what waited. What the client sends passes at once.
func TestForwardDelayedHoldsAnswersBackInOrder(t *testing.T) {
	ns := NewNS(t)
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { echo.Close() })
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	var delay atomic.Int64
	delay.Store(int64(time.Hour))
	r := ForwardDelayed(t, ns, "127.0.0.1:7070", echo.Addr().String(), func() time.Duration { return time.Duration(delay.Load()) })

	var c net.Conn
	if err := netns.Do(ns.File, func() error {
		var err error
		c, err = net.Dial("tcp", "127.0.0.1:7070")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sent := 0
	for _, s := range []string{"first ", "second ", "third"} {
		if _, err := c.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
		// Each write echoed and held before the next, so that the relay
		// reads them apart and must keep them in order.
		sent += len(s)
		for deadline := time.Now().Add(10 * time.Second); r.Held() != int64(sent); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the relay holds %d bytes after %d were echoed", r.Held(), sent)
			}
		}
	}
	if got := r.Held(); got != int64(len("first second third")) {
		t.Fatalf("the relay holds %d bytes, want every echoed byte", got)
	}
	// Nothing passed while the delay held: a read finds nothing yet.
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := c.Read(make([]byte, 64)); n != 0 || err == nil {
		t.Fatalf("read %d bytes through the held relay (%v)", n, err)
	}

	delay.Store(0)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len("first second third"))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "first second third" {
		t.Fatalf("released: %q, %v", got, err)
	}
	for deadline := time.Now().Add(10 * time.Second); r.Held() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the relay still counts %d bytes held after passing them on", r.Held())
		}
	}
}
