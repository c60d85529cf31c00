package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// The drop monitor: the program writes a record of each dropped frame, up
// to DropRecordsPerSecond per tap and second, into the ring buffer
// drop_records (state, pinned apart: every program instance writes into the
// one ring). Records the budget or a full ring keeps out are counted in
// drop_records_lost. Allowed frames write nothing.

// Mirrors of bpf/datapath.c.
const (
	DropRecordsPerSecond = 32
	DropRecordBytes      = 128
	DropRingBytes        = 256 << 10
	dropNoRules          = 255
	dropRecordHeader     = 32
	lostRingFull         = 0
	lostRateLimited      = 1
)

// ruleNames are the titles of docs/datapath.md's rules, by number.
var ruleNames = map[uint8]string{
	1: "no rules", 2: "stacked VLAN tags", 3: "ethertype list", 4: "anti-spoofing, source MAC", 5: "ARP",
	6: "other non-IP ethertypes", 7: "malformed IP", 8: "IPv6 extension headers", 9: "fragments",
	10: "anti-spoofing, IP", 11: "protocol list", 12: "to the host, or elsewhere", 13: "TCP and UDP to the host",
	14: "ND to the host", 15: "other ICMP", 16: "other protocols to the host", 17: "default action",
}

// RuleName is the title of rule n of docs/datapath.md ("How a frame is
// judged").
func RuleName(n uint8) string {
	if s, ok := ruleNames[n]; ok {
		return s
	}
	return fmt.Sprintf("rule %d", n)
}

// DropRecord is one dropped frame as the program recorded it, with the
// headers of its first DropRecordBytes read.
type DropRecord struct {
	Time       time.Time
	Ifindex    uint32
	VPC        VPC
	Attachment Attachment
	// Decision is why it was dropped, unless NoRules: the tap had no rules
	// (counted unattributed, policy_unavailable).
	Decision Decision
	NoRules  bool
	Rule     uint8
	Length   uint32
	Frame    []byte // the first bytes, as captured

	SrcMAC, DstMAC   net.HardwareAddr
	EtherType        uint16
	SrcIP, DstIP     netip.Addr
	Protocol         uint8 // IP protocol (the upper layer's, past IPv6 extension headers)
	SrcPort, DstPort uint16
	ICMP             bool // ICMPType and ICMPCode are set
	ICMPType         uint8
	ICMPCode         uint8
}

// ErrNoDropMonitor: the datapath was opened without the program's state
// (OpenPinned), or the kernel has no ring buffer.
var ErrNoDropMonitor = errors.New("no drop monitor")

// DropMonitor reads the program's records of dropped frames.
type DropMonitor struct {
	r *ringbuf.Reader
	// bootWall is the wall time at CLOCK_MONOTONIC 0, measured at open:
	// the program stamps records with bpf_ktime_get_ns.
	bootWall time.Time
}

// OpenDropMonitor starts reading the drop records of every program
// instance. There is one reader per node: the daemon's.
func (d *Datapath) OpenDropMonitor() (*DropMonitor, error) {
	if d.objs.DropRecords == nil || d.routeEpoch == nil {
		return nil, ErrNoDropMonitor
	}
	r, err := ringbuf.NewReader(d.objs.DropRecords)
	if err != nil {
		return nil, fmt.Errorf("open the drop records: %w", err)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		_ = r.Close()
		return nil, fmt.Errorf("read the monotonic clock: %w", err)
	}
	return &DropMonitor{r: r, bootWall: time.Now().Add(-time.Duration(ts.Nano()))}, nil
}

// Read blocks until the next record; after Close it returns an error
// wrapping os.ErrClosed.
func (m *DropMonitor) Read() (DropRecord, error) {
	for {
		rec, err := m.r.Read()
		if errors.Is(err, ringbuf.ErrClosed) {
			return DropRecord{}, fmt.Errorf("read a drop record: %w", os.ErrClosed)
		}
		if err != nil {
			return DropRecord{}, fmt.Errorf("read a drop record: %w", err)
		}
		if r, ok := parseDropRecord(rec.RawSample, m.bootWall); ok {
			return r, nil
		}
	}
}

// Close ends reading; a blocked Read returns.
func (m *DropMonitor) Close() error { return m.r.Close() }

func parseDropRecord(b []byte, bootWall time.Time) (DropRecord, bool) {
	if len(b) < dropRecordHeader {
		return DropRecord{}, false
	}
	le := binary.LittleEndian
	r := DropRecord{
		Time:       bootWall.Add(time.Duration(le.Uint64(b[0:]))),
		VPC:        VPC(le.Uint64(b[8:])),
		Ifindex:    le.Uint32(b[16:]),
		Length:     le.Uint32(b[20:]),
		Attachment: Attachment(le.Uint16(b[24:])),
		Rule:       b[27],
	}
	if b[26] == dropNoRules {
		r.NoRules = true
	} else {
		r.Decision = Decision(b[26])
	}
	n := int(le.Uint16(b[28:]))
	if n > DropRecordBytes || dropRecordHeader+n > len(b) {
		n = 0
	}
	r.Frame = append([]byte(nil), b[dropRecordHeader:dropRecordHeader+n]...)
	r.parseFrame()
	return r, true
}

// parseFrame reads the headers of r.Frame as far as it holds them.
func (r *DropRecord) parseFrame() {
	f := r.Frame
	if len(f) < 14 {
		return
	}
	r.DstMAC, r.SrcMAC = net.HardwareAddr(f[0:6]), net.HardwareAddr(f[6:12])
	r.EtherType = binary.BigEndian.Uint16(f[12:])
	p := f[14:]
	var l4 []byte
	switch r.EtherType {
	case 0x0806: // ARP for IPv4 over Ethernet: sender and target addresses
		if len(p) >= 28 && binary.BigEndian.Uint16(p[2:]) == 0x0800 && p[4] == 6 && p[5] == 4 {
			r.SrcIP, r.DstIP = netip.AddrFrom4([4]byte(p[14:18])), netip.AddrFrom4([4]byte(p[24:28]))
		}
		return
	case 0x0800:
		if len(p) < 20 || p[0]>>4 != 4 {
			return
		}
		r.SrcIP, r.DstIP = netip.AddrFrom4([4]byte(p[12:16])), netip.AddrFrom4([4]byte(p[16:20]))
		r.Protocol = p[9]
		ihl := int(p[0]&0xf) * 4
		// A later fragment carries no upper-layer header.
		if binary.BigEndian.Uint16(p[6:])&0x1fff != 0 || ihl < 20 || len(p) < ihl {
			return
		}
		l4 = p[ihl:]
	case 0x86dd:
		if len(p) < 40 || p[0]>>4 != 6 {
			return
		}
		r.SrcIP, r.DstIP = netip.AddrFrom16([16]byte(p[8:24])), netip.AddrFrom16([16]byte(p[24:40]))
		next, rest := p[6], p[40:]
		for range 8 {
			switch next {
			case 0, 43, 60: // hop-by-hop, routing, destination options
				if len(rest) < 8 {
					r.Protocol = next
					return
				}
				next, rest = rest[0], rest[min(len(rest), 8+int(rest[1])*8):]
				continue
			case 44: // fragment: only the first carries the upper layer
				if len(rest) < 8 {
					r.Protocol = next
					return
				}
				if binary.BigEndian.Uint16(rest[2:])&0xfff8 != 0 {
					r.Protocol = rest[0]
					return
				}
				next, rest = rest[0], rest[8:]
				continue
			}
			break
		}
		r.Protocol, l4 = next, rest
	default:
		return
	}
	switch r.Protocol {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP:
		if len(l4) >= 4 {
			r.SrcPort, r.DstPort = binary.BigEndian.Uint16(l4[0:]), binary.BigEndian.Uint16(l4[2:])
		}
	case unix.IPPROTO_ICMP, unix.IPPROTO_ICMPV6:
		if len(l4) >= 2 {
			r.ICMP, r.ICMPType, r.ICMPCode = true, l4[0], l4[1]
		}
	}
}

// DecisionTotals returns the frames every program instance judged on this
// node, by decision, since the state was made.
func (d *Datapath) DecisionTotals() (map[Decision]uint64, error) {
	if d.objs.DecisionTotals == nil || d.routeEpoch == nil {
		return nil, ErrNoProgramState
	}
	out := make(map[Decision]uint64, len(Decisions))
	for _, dec := range Decisions {
		n, err := sumPerCPU(d.objs.DecisionTotals, uint32(dec))
		if err != nil {
			return nil, fmt.Errorf("read decision totals: %w", err)
		}
		out[dec] = n
	}
	return out, nil
}

// DropRecordsLost returns the records the program could not write: for a
// full ring (nobody read fast enough, or nobody read) and beyond a tap's
// per-second budget.
func (d *Datapath) DropRecordsLost() (ringFull, rateLimited uint64, err error) {
	if d.objs.DropRecordsLost == nil || d.routeEpoch == nil {
		return 0, 0, ErrNoProgramState
	}
	if ringFull, err = sumPerCPU(d.objs.DropRecordsLost, lostRingFull); err != nil {
		return 0, 0, fmt.Errorf("read lost drop records: %w", err)
	}
	if rateLimited, err = sumPerCPU(d.objs.DropRecordsLost, lostRateLimited); err != nil {
		return 0, 0, fmt.Errorf("read lost drop records: %w", err)
	}
	return ringFull, rateLimited, nil
}

func sumPerCPU(m *ebpf.Map, key uint32) (uint64, error) {
	var per []uint64
	if err := m.Lookup(key, &per); err != nil {
		return 0, err
	}
	var sum uint64
	for _, n := range per {
		sum += n
	}
	return sum, nil
}
