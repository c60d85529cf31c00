// Package link reads and changes links over raw rtnetlink, in a network
// namespace chosen by file descriptor, and gives typed views of tenant taps.
//
// The one rule a caller must know: a tenant tap is removed only through
// node/teardown, the one teardown that CNI DEL and GC, `tap del` and the
// reclaim share, which deletes the link before clearing its eBPF rows. The
// deletes here are its tools and check before they remove: DeleteVerified
// reads the link again and refuses when its name or owner stamp changed, so
// a decision made on an old read never removes a link that has since become
// something else, and DeleteGroup removes only the batch the teardown moved
// into a group and verified. (node/tap's Delete, which undoes a failed CNI
// ADD, also goes through DeleteVerified.)
package link

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/node/link/driver"
)

// Sentinel errors callers branch on.
var (
	// ErrLinkGone: no link has the ifindex or name asked for.
	ErrLinkGone = errors.New("link is gone")
	// ErrLinkChanged: the link no longer has the name or owner stamp the
	// caller read, so the caller's decision about it no longer holds.
	ErrLinkChanged = errors.New("link changed since it was read")
	// ErrDumpInterrupted: the kernel flagged every attempt at a link dump as
	// inconsistent (NLM_F_DUMP_INTR) because links kept changing during it.
	ErrDumpInterrupted = errors.New("link dump interrupted by concurrent changes")
)

// DefaultDumpAttempts bounds the retries of an interrupted dump.
const DefaultDumpAttempts = 5

// Conn is a route netlink connection in one network namespace. It is safe for
// concurrent use; requests are serialised.
type Conn struct {
	mu           sync.Mutex
	ns           *os.File // a duplicate of the namespace handle, for redialling; nil: caller's namespace
	nl           *netlink.Conn
	dumpAttempts int
	recvBuf      []byte
}

// Dial opens a route netlink socket in the network namespace ns, or in the
// caller's namespace when ns is nil. The socket stays in that namespace for
// its lifetime whatever thread uses it.
func Dial(ns *os.File) (*Conn, error) {
	if err := driver.Register(); err != nil {
		return nil, fmt.Errorf("register link drivers: %w", err)
	}
	c := &Conn{dumpAttempts: DefaultDumpAttempts, recvBuf: make([]byte, 256<<10)}
	if ns != nil {
		fd, err := unix.FcntlInt(ns.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("duplicate namespace handle %s: %w", ns.Name(), err)
		}
		c.ns = os.NewFile(uintptr(fd), ns.Name())
	}
	if err := c.dial(); err != nil {
		if c.ns != nil {
			c.ns.Close()
		}
		return nil, err
	}
	return c, nil
}

func (c *Conn) dial() error {
	cfg := &netlink.Config{Strict: true}
	if c.ns != nil {
		cfg.NetNS = int(c.ns.Fd())
	}
	nl, err := netlink.Dial(netlinkRoute, cfg)
	if err != nil {
		return fmt.Errorf("dial rtnetlink: %w", err)
	}
	// Dumps of thousands of links arrive faster than one goroutine parses
	// them; a larger buffer avoids ENOBUFS. Failure only costs headroom.
	_ = nl.SetReadBuffer(4 << 20)
	c.nl = nl
	return nil
}

// Close closes the socket.
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.nl.Close()
	if c.ns != nil {
		err = errors.Join(err, c.ns.Close())
	}
	return err
}

// NetNS names the network namespace the connection reads and changes links
// in, as readlink(2) of /proc/self/ns/net names one: "net:[4026531840]". It
// asks the socket itself (SIOCGSKNS, Linux 4.9), so the answer is the
// namespace the links come from, whichever thread dialled or asks.
func (c *Conn) NetNS() (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rc, err := c.nl.SyscallConn()
	if err != nil {
		return "", fmt.Errorf("network namespace of the rtnetlink socket: %w", err)
	}
	var nsfd int
	var ioctlErr error
	if err := rc.Control(func(fd uintptr) { nsfd, ioctlErr = socketNetNS(fd) }); err != nil {
		return "", fmt.Errorf("network namespace of the rtnetlink socket: %w", err)
	}
	if ioctlErr != nil {
		return "", fmt.Errorf("network namespace of the rtnetlink socket: SIOCGSKNS: %w", ioctlErr)
	}
	defer unix.Close(nsfd)
	var st unix.Stat_t
	if err := unix.Fstat(nsfd, &st); err != nil {
		return "", fmt.Errorf("network namespace of the rtnetlink socket: %w", err)
	}
	return fmt.Sprintf("net:[%d]", st.Ino), nil
}

// SetDumpAttempts changes how many times an interrupted dump is tried before
// ErrDumpInterrupted; n < 1 means 1.
func (c *Conn) SetDumpAttempts(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dumpAttempts = max(n, 1)
}

// do runs fn with the socket's deadlines tied to ctx: a context deadline
// becomes the socket deadline, and cancellation unblocks a pending receive.
// It holds c.mu for the duration.
func (c *Conn) do(ctx context.Context, fn func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		if err := c.nl.SetDeadline(dl); err != nil {
			return fmt.Errorf("set netlink deadline: %w", err)
		}
	}
	nl := c.nl
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = nl.SetDeadline(time.Unix(1, 0))
		close(fired)
	})
	err := fn()
	if !stop() {
		<-fired // so that its deadline cannot land after the reset below
	}
	if err != nil && (ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded)) {
		// The request was cut short: replies to it may still arrive and would
		// be read as answers to the next request. Start on a fresh socket.
		nl.Close()
		if derr := c.dial(); derr != nil {
			return errors.Join(context.Cause(ctx), err, derr)
		}
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		return fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
	}
	_ = nl.SetDeadline(time.Time{})
	return err
}

// execute sends one request and returns its replies.
func (c *Conn) execute(ctx context.Context, typ netlink.HeaderType, flags netlink.HeaderFlags, m rtnetlink.Message) ([]netlink.Message, error) {
	data, err := m.MarshalBinary()
	if err != nil {
		return nil, err
	}
	return c.executeRaw(ctx, typ, flags, data)
}

// executeRaw is execute for a request already encoded.
func (c *Conn) executeRaw(ctx context.Context, typ netlink.HeaderType, flags netlink.HeaderFlags, data []byte) ([]netlink.Message, error) {
	var msgs []netlink.Message
	err := c.do(ctx, func() error {
		var err error
		msgs, err = c.nl.Execute(netlink.Message{Header: netlink.Header{Type: typ, Flags: flags}, Data: data})
		return err
	})
	return msgs, err
}

// isNoDevice reports whether err is the kernel saying the link does not exist.
func isNoDevice(err error) bool {
	return errors.Is(err, unix.ENODEV)
}

// rtextFilterSkipStats is RTEXT_FILTER_SKIP_STATS (linux/rtnetlink.h), which
// golang.org/x/sys/unix does not define: a quarter less to build and parse
// per link, and nothing this package reads is lost.
const rtextFilterSkipStats = 1 << 3
