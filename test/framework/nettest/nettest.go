// Package nettest is the harness of privileged tests: a fresh network
// namespace per test, removed on every exit path, and helpers that put a tap
// into each state docs/kernel.md measures (no fd; held by another process; held
// and down; a multiqueue queue detached with its fd open; fd closed again).
//
// It uses ip(8) to set scenes; the product never does.
package nettest

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/netns"
	"github.com/datum-cloud/galactic-node/node/tun"
)

// SkipPrivilegedEnv, set to 1, skips privileged tests (make test-unit).
const SkipPrivilegedEnv = "GALACTICTEST_SKIP_PRIVILEGED"

// RequirePrivileged skips t unless it runs as root, with a message that says
// how to run it. Under CI=true it never skips: a CI run that cannot run a
// privileged test fails instead of passing silently.
func RequirePrivileged(t testing.TB) {
	t.Helper()
	reason := ""
	switch {
	case os.Getenv(SkipPrivilegedEnv) == "1":
		reason = SkipPrivilegedEnv + "=1"
	case os.Geteuid() != 0:
		reason = "not running as root"
	default:
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("privileged test cannot run under CI=true (%s): CI runs `make test` as root", reason)
	}
	t.Skipf("privileged test skipped (%s): run `sudo make test` to include it", reason)
}

// NS is a network namespace made for one test.
type NS struct {
	Name string
	File *os.File // open handle, for link.Dial and tun.Open
}

// NewNS creates a network namespace for t, with lo up, and removes it when t
// ends, whether it passed, failed or panicked.
func NewNS(t testing.TB) *NS {
	t.Helper()
	RequirePrivileged(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	ns := &NS{Name: "galactic-test-" + hex.EncodeToString(b[:])}
	Run(t, "ip", "netns", "add", ns.Name)
	t.Cleanup(func() {
		if ns.File != nil {
			ns.File.Close()
		}
		if out, err := exec.Command("ip", "netns", "del", ns.Name).CombinedOutput(); err != nil {
			t.Errorf("remove netns %s: %v: %s", ns.Name, err, out)
		}
	})
	f, err := os.Open("/run/netns/" + ns.Name)
	if err != nil {
		t.Fatalf("open netns %s: %v", ns.Name, err)
	}
	ns.File = f
	ns.IP(t, "link", "set", "lo", "up")
	return ns
}

// IP runs `ip -n NAME args...` and returns its output, failing t on error.
func (ns *NS) IP(t testing.TB, args ...string) string {
	t.Helper()
	return Run(t, "ip", append([]string{"-n", ns.Name}, args...)...)
}

// Dial opens a link.Conn in the namespace, closed when t ends.
func (ns *NS) Dial(t testing.TB) *link.Conn {
	t.Helper()
	c, err := link.Dial(ns.File)
	if err != nil {
		t.Fatalf("dial rtnetlink in %s: %v", ns.Name, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Run runs a command and returns its combined output, failing t on error.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// NewTap creates a persistent tap with no file descriptor open: the state a
// tap is in after its VMM exits without CNI DEL.
func NewTap(t testing.TB, ns *NS, name string, mode tun.Mode) {
	t.Helper()
	f, err := tun.Open(ns.File, name, mode)
	if err != nil {
		t.Fatalf("create tap %s: %v", name, err)
	}
	defer f.Close()
	if err := tun.SetPersist(f, true); err != nil {
		t.Fatalf("persist tap %s: %v", name, err)
	}
}

// Holder is another process that holds queues of a tap open, as a VMM does.
type Holder struct {
	cmd *exec.Cmd
}

// HoldOptions says how a Holder holds its tap.
type HoldOptions struct {
	Mode     tun.Mode
	Queues   int // file descriptors to attach; 0 means 1
	Detached int // of those, how many to detach (multiqueue only) before handing them over
}

// Hold attaches queues to the tap called name and hands the file descriptors
// to a child process, closing the test's own copies: afterwards only the
// child holds the tap. The child is killed when t ends or on Release.
func Hold(t testing.TB, ns *NS, name string, opts HoldOptions) *Holder {
	t.Helper()
	h, err := TryHold(t, ns, name, opts)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TryHold is Hold for a VMM that may fail to open its tap, as one does when
// the kernel refuses the attach (EBUSY on a single-queue tap that a file
// already holds): the error wraps the kernel's, and nothing is left held.
func TryHold(t testing.TB, ns *NS, name string, opts HoldOptions) (*Holder, error) {
	queues := max(opts.Queues, 1)
	files := make([]*os.File, 0, queues)
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for i := range queues {
		f, err := tun.Open(ns.File, name, opts.Mode)
		if err != nil {
			return nil, fmt.Errorf("attach queue %d of %s: %w", i, name, err)
		}
		files = append(files, f)
	}
	for i := range opts.Detached {
		if err := tun.DetachQueue(files[i]); err != nil {
			return nil, fmt.Errorf("detach queue %d of %s: %w", i, name, err)
		}
	}
	cmd := exec.Command("sleep", "3600")
	cmd.ExtraFiles = files
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start holder of %s: %w", name, err)
	}
	h := &Holder{cmd: cmd}
	t.Cleanup(h.Release)
	return h, nil
}

// PID is the holder's process ID.
func (h *Holder) PID() int { return h.cmd.Process.Pid }

// Release ends the holder, closing its file descriptors. It is idempotent.
func (h *Holder) Release() {
	if h.cmd.ProcessState != nil {
		return
	}
	_ = h.cmd.Process.Kill()
	_ = h.cmd.Wait()
}

// Inode returns the inode number of fi: how namespaces are told apart.
func Inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}

// BPFFS mounts a private bpf filesystem on a temporary folder for t and
// unmounts it when t ends, so pinned maps never outlive the test.
func BPFFS(t testing.TB) string {
	t.Helper()
	RequirePrivileged(t)
	dir := t.TempDir()
	if err := syscall.Mount("bpffs", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount bpffs %s: %v", dir, err)
		}
	})
	return dir
}

// ForwardLoopback makes hostAddr, a TCP address on the host's loopback (a
// test API server), reachable at the same address on the loopback of ns:
// it listens inside ns and relays each connection to the host. TLS passes
// through untouched. It stops when t ends.
func ForwardLoopback(t testing.TB, ns *NS, hostAddr string) {
	t.Helper()
	Forward(t, ns, hostAddr, hostAddr)
}

// listenIn listens on TCP listenAddr inside ns.
func listenIn(t testing.TB, ns *NS, listenAddr string) net.Listener {
	t.Helper()
	var l net.Listener
	if err := netns.Do(ns.File, func() error {
		var err error
		l, err = net.Listen("tcp", listenAddr)
		return err
	}); err != nil {
		t.Fatalf("listen on %s in %s: %v", listenAddr, ns.Name, err)
	}
	return l
}

// Forward relays TCP connections made to listenAddr inside ns to target on
// the host's loopback, until t ends.
func Forward(t testing.TB, ns *NS, listenAddr, target string) {
	t.Helper()
	l := listenIn(t, ns, listenAddr)
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer in.Close()
				out, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer out.Close()
				go func() { _, _ = io.Copy(out, in); out.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(in, out)
			}()
		}
	}()
}

// Veth joins two namespaces with a veth pair, addressed addrA (a CIDR, in
// a) and addrB (in b), both up. It goes with the namespaces.
func Veth(t testing.TB, a, b *NS, addrA, addrB string) {
	t.Helper()
	ifA, ifB := "veth"+a.Name[len(a.Name)-6:], "veth"+b.Name[len(b.Name)-6:]
	a.IP(t, "link", "add", ifA, "type", "veth", "peer", "name", ifB, "netns", b.Name)
	a.IP(t, "addr", "add", addrA, "dev", ifA)
	a.IP(t, "link", "set", ifA, "up")
	b.IP(t, "addr", "add", addrB, "dev", ifB)
	b.IP(t, "link", "set", ifB, "up")
}

// PinnedRowsKeyedBy walks every map pinned in pinDir (not a list a package
// keeps) and counts, per map, the keys that start with ifindex as a native
// u32. Maps named in skip (counters keyed otherwise) are not walked.
func PinnedRowsKeyedBy(t testing.TB, pinDir string, ifindex uint32, skip map[string]bool) map[string]int {
	t.Helper()
	entries, err := os.ReadDir(pinDir)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]int{}
	for _, e := range entries {
		if e.IsDir() || skip[e.Name()] {
			continue
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, e.Name()), nil)
		if err != nil {
			t.Fatalf("load pinned map %s: %v", e.Name(), err)
		}
		key := make([]byte, m.KeySize())
		next := make([]byte, m.KeySize())
		var prev any // nil: the first key
		for {
			if err := m.NextKey(prev, next); err != nil {
				if !errors.Is(err, ebpf.ErrKeyNotExist) {
					t.Fatalf("walk %s: %v", e.Name(), err)
				}
				break
			}
			copy(key, next)
			prev = key
			if len(key) >= 4 && binary.NativeEndian.Uint32(key[:4]) == ifindex {
				found[e.Name()]++
			}
		}
		m.Close()
	}
	return found
}

// Partition drops every IPv4 packet between ns and addr, in both
// directions, sending no reset: requests hang until their own bounds, as
// in a network partition. It returns the heal, which t's end runs too; a
// second heal does nothing.
func Partition(t testing.TB, ns *NS, addr string) (heal func()) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.File.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	table := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "galactic_partition"})
	for _, dir := range []struct {
		hook   *nftables.ChainHook
		offset uint32 // of addr in the IPv4 header: daddr out, saddr in
	}{{nftables.ChainHookOutput, 16}, {nftables.ChainHookInput, 12}} {
		chain := c.AddChain(&nftables.Chain{Name: "drop" + strconv.Itoa(int(dir.offset)), Table: table, Type: nftables.ChainTypeFilter,
			Hooknum: dir.hook, Priority: nftables.ChainPriorityFilter})
		c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: dir.offset, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: net.ParseIP(addr).To4()},
			&expr.Verdict{Kind: expr.VerdictDrop},
		}})
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("partition %s from %s: %v", ns.Name, addr, err)
	}
	var once sync.Once
	heal = func() {
		once.Do(func() {
			c.DelTable(table)
			if err := c.Flush(); err != nil {
				t.Errorf("heal the partition of %s from %s: %v", ns.Name, addr, err)
			}
		})
	}
	t.Cleanup(heal)
	return heal
}
