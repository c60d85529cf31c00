package datapath_test

import (
	"context"
	"errors"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
)

// readDrops reads records until want arrived or wait passed.
func readDrops(t *testing.T, m *datapath.DropMonitor, want int, wait time.Duration) []datapath.DropRecord {
	t.Helper()
	type res struct {
		r   datapath.DropRecord
		err error
	}
	c := make(chan res, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			r, err := m.Read()
			c <- res{r, err}
			if err != nil {
				return
			}
		}
	}()
	var out []datapath.DropRecord
	deadline := time.After(wait)
	for len(out) < want {
		select {
		case x := <-c:
			if x.err != nil {
				t.Fatalf("read a drop record: %v", x.err)
			}
			out = append(out, x.r)
		case <-deadline:
			_ = m.Close()
			<-done
			return out
		}
	}
	_ = m.Close()
	<-done
	return out
}

// TestADroppedFrameIsRecordedWithItsHeadersAndAnAllowedOneIsNot: a frame
// the tap's VM sends from another address yields one record naming the
// tap, its identity, spoofed and rule 10, with the frame's MACs,
// addresses, protocol and ports; an allowed frame yields none, and both
// move the node's totals.
func TestADroppedFrameIsRecordedWithItsHeadersAndAnAllowedOneIsNot(t *testing.T) {
	s := newTapScene(t, tenant{VPC: 62, Attachment: 91})
	s.register(t, datapath.Policy{DefaultAction: datapath.ActionAllow})
	mon, err := s.dp.OpenDropMonitor()
	if err != nil {
		t.Fatal(err)
	}
	before, err := s.dp.DecisionTotals()
	if err != nil {
		t.Fatal(err)
	}
	s.write(t, udp4(brMAC, vm4, far4, 40000, 9999, ipv4Opts{})(nil)[0])         // allowed
	s.write(t, udp4(brMAC, "10.99.99.99", far4, 40001, 53, ipv4Opts{})(nil)[0]) // spoofed
	recs := readDrops(t, mon, 2, 3*time.Second)
	if len(recs) != 1 {
		t.Fatalf("records: %+v, want exactly the spoofed frame's", recs)
	}
	r := recs[0]
	if r.Ifindex != s.ifindex || r.VPC != s.id.VPC || r.Attachment != s.id.Attachment || r.NoRules ||
		r.Decision != datapath.DecisionSpoofed || r.Rule != 10 || datapath.RuleName(r.Rule) != "anti-spoofing, IP" {
		t.Fatalf("record %+v: want tap %d, identity %v, spoofed by rule 10", r, s.ifindex, s.id)
	}
	if r.SrcMAC.String() != vmMAC.String() || r.DstMAC.String() != brMAC.String() || r.EtherType != 0x0800 ||
		r.SrcIP.String() != "10.99.99.99" || r.DstIP.String() != far4 || r.Protocol != 17 || r.SrcPort != 40001 || r.DstPort != 53 ||
		r.Length == 0 || len(r.Frame) == 0 {
		t.Fatalf("record headers %+v: want the frame's", r)
	}
	if d := time.Since(r.Time); d < -time.Minute || d > time.Minute {
		t.Fatalf("record time %v is %v from now", r.Time, d)
	}
	after, err := s.dp.DecisionTotals()
	if err != nil {
		t.Fatal(err)
	}
	if after[datapath.DecisionAllow]-before[datapath.DecisionAllow] != 1 || after[datapath.DecisionSpoofed]-before[datapath.DecisionSpoofed] != 1 {
		t.Fatalf("totals moved %v -> %v, want one allow and one spoofed", before, after)
	}
	if _, err := mon.Read(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Read after Close: %v, want os.ErrClosed", err)
	}
}

// TestAFloodIsRecordedWithinItsTapsBudget: a tap that sends thousands of
// dropped frames in a moment yields at most its budget of records (plus one
// per CPU racing at the window's edge), the rest counted rate limited; a
// frame of a tap without rules in the same moment is still recorded.
func TestAFloodIsRecordedWithinItsTapsBudget(t *testing.T) {
	s := newTapScene(t, tenant{VPC: 62, Attachment: 92})
	s.register(t, datapath.Policy{DefaultAction: datapath.ActionAllow})
	mon, err := s.dp.OpenDropMonitor()
	if err != nil {
		t.Fatal(err)
	}
	_, limitedBefore, err := s.dp.DropRecordsLost()
	if err != nil {
		t.Fatal(err)
	}
	const flood = 2000
	frame := udp4(brMAC, "10.99.99.99", far4, 40001, 53, ipv4Opts{})(nil)[0]
	start := time.Now()
	for range flood {
		s.write(t, frame)
	}
	elapsed := time.Since(start)
	// Another tap, never registered: its drop is policy_unavailable.
	other := tenant{VPC: 62, Attachment: 93}
	fd := newVMMTap(t, s.ns, other.TapName())
	l, err := s.ns.Dial(t).GetByName(context.Background(), other.TapName())
	if err != nil {
		t.Fatal(err)
	}
	// Registered, then unregistered: its program stays, its rules go.
	reg := s.registration(datapath.Policy{DefaultAction: datapath.ActionAllow})
	reg.Identity = other.identity()
	if err := s.reg.RegisterInterface(context.Background(), l.Index, reg); err != nil {
		t.Fatal(err)
	}
	if err := s.reg.UnregisterInterface(context.Background(), l.Index); err != nil {
		t.Fatal(err)
	}
	writeFd(t, fd, frame)

	recs := readDrops(t, mon, flood, 3*time.Second)
	seconds := int(elapsed/time.Second) + 1
	ofTap, ofOther := 0, 0
	for _, r := range recs {
		switch r.Ifindex {
		case s.ifindex:
			ofTap++
		case l.Index:
			if !r.NoRules || r.Rule != 1 {
				t.Errorf("the unregistered tap's record %+v: want no rules, rule 1", r)
			}
			ofOther++
		}
	}
	limit := seconds * (datapath.DropRecordsPerSecond + runtime.NumCPU())
	if ofTap == 0 || ofTap > limit {
		t.Fatalf("a flood of %d frames over %v yielded %d records, want 1 to %d", flood, elapsed, ofTap, limit)
	}
	if ofOther != 1 {
		t.Fatalf("the other tap's drop yielded %d records beside the flood, want 1", ofOther)
	}
	_, limited, err := s.dp.DropRecordsLost()
	if err != nil {
		t.Fatal(err)
	}
	if got := limited - limitedBefore; got != uint64(flood-ofTap) {
		t.Fatalf("rate-limited records counted %d, want %d (%d frames, %d recorded)", got, flood-ofTap, flood, ofTap)
	}
}
