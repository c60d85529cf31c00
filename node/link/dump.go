package link

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Links returns every link of the namespace from one RTM_GETLINK dump, with
// statistics skipped. A dump the kernel flags as interrupted by concurrent
// changes is discarded and retried; after the configured attempts, Links
// fails with ErrDumpInterrupted rather than return a view that may miss or
// misreport a link.
func (c *Conn) Links(ctx context.Context) ([]Link, error) {
	skipStats := uint32(rtextFilterSkipStats)
	req, err := (&rtnetlink.LinkMessage{Family: afUnspec, Attributes: &rtnetlink.LinkAttributes{ExtMask: &skipStats}}).MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("encode link dump request: %w", err)
	}
	c.mu.Lock()
	attempts := c.dumpAttempts
	c.mu.Unlock()
	for range attempts {
		var (
			links       []Link
			interrupted bool
		)
		err := c.do(ctx, func() error {
			var err error
			links, interrupted, err = c.dumpLinks(req)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("dump links: %w", err)
		}
		if !interrupted {
			resolveMasters(links)
			return links, nil
		}
	}
	return nil, fmt.Errorf("dump links: %d attempts: %w", attempts, ErrDumpInterrupted)
}

// dumpLinks runs one dump. It reads the socket itself instead of through
// netlink.Conn.Receive because that drops the final NLMSG_DONE, and the
// kernel may set NLM_F_DUMP_INTR on that message alone. Called with c.mu held.
func (c *Conn) dumpLinks(req []byte) (links []Link, interrupted bool, err error) {
	sent, err := c.nl.Send(netlink.Message{
		Header: netlink.Header{Type: rtmGetLink, Flags: netlink.Request | netlink.Dump},
		Data:   req,
	})
	if err != nil {
		return nil, false, err
	}
	rc, err := c.nl.SyscallConn()
	if err != nil {
		return nil, false, err
	}
	for {
		var (
			n, rflags int
			rerr      error
		)
		err := rc.Read(func(fd uintptr) bool {
			n, _, rflags, _, rerr = unix.Recvmsg(int(fd), c.recvBuf, nil, unix.MSG_DONTWAIT)
			return !errors.Is(rerr, unix.EAGAIN)
		})
		if err == nil {
			err = rerr
		}
		if err != nil {
			return nil, false, fmt.Errorf("receive: %w", err)
		}
		if rflags&unix.MSG_TRUNC != 0 {
			return nil, false, fmt.Errorf("receive: message larger than %d bytes truncated", len(c.recvBuf))
		}
		done, intr, err := parseDumpChunk(c.recvBuf[:n], sent.Header.Sequence, &links)
		interrupted = interrupted || intr
		if err != nil || done {
			return links, interrupted, err
		}
	}
}

// parseDumpChunk decodes the netlink messages of one datagram of a link dump
// answering sequence seq, appending links. Messages of other sequences are
// leftovers of an earlier request and are skipped.
func parseDumpChunk(b []byte, seq uint32, links *[]Link) (done, interrupted bool, err error) {
	const hdrLen = sizeofNlMsghdr
	for len(b) >= hdrLen {
		length := int(binary.NativeEndian.Uint32(b[0:4]))
		typ := binary.NativeEndian.Uint16(b[4:6])
		flags := netlink.HeaderFlags(binary.NativeEndian.Uint16(b[6:8]))
		msgSeq := binary.NativeEndian.Uint32(b[8:12])
		if length < hdrLen || length > len(b) {
			return false, interrupted, fmt.Errorf("malformed netlink message: length %d of %d bytes", length, len(b))
		}
		data := b[hdrLen:length]
		b = b[min(nlmsgAlign(length), len(b)):]
		if msgSeq != seq {
			continue
		}
		if flags&netlink.DumpInterrupted != 0 {
			interrupted = true
		}
		switch typ {
		case nlmsgDone, nlmsgError:
			if len(data) >= 4 {
				if errno := int32(binary.NativeEndian.Uint32(data[0:4])); errno < 0 {
					return true, interrupted, unix.Errno(-errno)
				}
			}
			return true, interrupted, nil
		case rtmNewLink:
			var m rtnetlink.LinkMessage
			if err := m.UnmarshalBinary(data); err != nil {
				return false, interrupted, fmt.Errorf("decode link message: %w", err)
			}
			*links = append(*links, fromMessage(&m))
		}
	}
	return false, interrupted, nil
}

func nlmsgAlign(n int) int { return (n + nlmsgAlignTo - 1) &^ (nlmsgAlignTo - 1) }
