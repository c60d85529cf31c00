// Command guest is the e2e node's stand-in for a VM behind a tap: it
// attaches to the tap by name, as QEMU's ifname= does, and writes frames
// into it as a guest's NIC would, so that the node's program judges them.
//
//	guest arp -tap T -mac M -src IP -target IP    # ask for target; exit 0 on its reply
//	guest udp -tap T -mac M -src IP -dst IP -port P [-count N]
//
// It uses no test framework: it runs inside the node's namespaces, where
// the e2e runs it with nsenter.
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: guest arp|udp -tap T -mac M -src IP ...")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	tap := fs.String("tap", "", "tap to attach to")
	macText := fs.String("mac", "", "the guest's MAC")
	src := fs.String("src", "", "the guest's source address")
	target := fs.String("target", "", "arp: the address asked for")
	dst := fs.String("dst", "", "udp: destination address")
	port := fs.Uint("port", 53, "udp: destination port")
	count := fs.Int("count", 1, "udp: frames to write")
	timeout := fs.Duration("timeout", 10*time.Second, "arp: how long to wait for the reply")
	_ = fs.Parse(os.Args[2:])
	mac, err := net.ParseMAC(*macText)
	if err != nil {
		fail("-mac: %v", err)
	}
	from, err := netip.ParseAddr(*src)
	if err != nil || !from.Is4() {
		fail("-src %q: want an IPv4 address", *src)
	}
	f, err := attach(*tap)
	if err != nil {
		fail("%v", err)
	}
	defer f.Close()
	switch os.Args[1] {
	case "arp":
		to, err := netip.ParseAddr(*target)
		if err != nil || !to.Is4() {
			fail("-target %q: want an IPv4 address", *target)
		}
		if err := askARP(f, mac, from, to, *timeout); err != nil {
			fail("%v", err)
		}
		fmt.Printf("%s is at a reply's sender\n", to)
	case "udp":
		to, err := netip.ParseAddr(*dst)
		if err != nil || !to.Is4() {
			fail("-dst %q: want an IPv4 address", *dst)
		}
		frame := udpFrame(mac, from, to, uint16(*port))
		for range *count {
			if _, err := f.Write(frame); err != nil {
				fail("write a frame into %s: %v", *tap, err)
			}
		}
		fmt.Printf("wrote %d frames from %s to %s:%d\n", *count, from, to, *port)
	default:
		fail("unknown mode %q", os.Args[1])
	}
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "guest: "+format+"\n", a...)
	os.Exit(1)
}

// attach opens the tap's queue, as a VMM does: a single-queue tap first,
// then as one queue of a multiqueue tap (the kernel refuses the other
// flavour with EINVAL).
func attach(name string) (*os.File, error) {
	for _, flags := range []uint16{unix.IFF_TAP | unix.IFF_NO_PI, unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_MULTI_QUEUE} {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open /dev/net/tun: %w", err)
		}
		var req [unix.IFNAMSIZ + 64]byte
		copy(req[:], name)
		binary.NativeEndian.PutUint16(req[unix.IFNAMSIZ:], flags)
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req[0])))
		if errno == 0 {
			return os.NewFile(uintptr(fd), "/dev/net/tun:"+name), nil
		}
		unix.Close(fd)
		if !errors.Is(errno, unix.EINVAL) {
			return nil, fmt.Errorf("attach to tap %s: %w", name, errno)
		}
	}
	return nil, fmt.Errorf("attach to tap %s: refused as single- and multiqueue", name)
}

var broadcast = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// askARP writes an ARP request for target and reads frames until the
// reply comes or timeout passes.
func askARP(f *os.File, mac net.HardwareAddr, from, target netip.Addr, timeout time.Duration) error {
	req := append(ethernet(broadcast, mac, 0x0806), 0, 1, 8, 0, 6, 4, 0, 1)
	req = append(req, mac...)
	req = append(req, from.AsSlice()...)
	req = append(req, 0, 0, 0, 0, 0, 0)
	req = append(req, target.AsSlice()...)
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 2048)
	for time.Now().Before(deadline) {
		// Asked again each second: the first may precede the bridge's
		// port reaching forwarding.
		if _, err := f.Write(req); err != nil {
			return fmt.Errorf("write the ARP request: %w", err)
		}
		if err := readUntil(f, buf, time.Second, func(b []byte) bool {
			return len(b) >= 42 && binary.BigEndian.Uint16(b[12:]) == 0x0806 && binary.BigEndian.Uint16(b[20:]) == 2 &&
				netip.AddrFrom4([4]byte(b[28:32])) == target
		}); err == nil {
			return nil
		}
	}
	return fmt.Errorf("no ARP reply for %s from %s within %s", target, from, timeout)
}

// readUntil reads frames for up to d and returns nil at the first that match
// accepts. A tap's fd is not pollable through os.File unless non-blocking,
// so it polls by hand.
func readUntil(f *os.File, buf []byte, d time.Duration, match func([]byte) bool) error {
	end := time.Now().Add(d)
	for {
		left := time.Until(end)
		if left <= 0 {
			return errors.New("timeout")
		}
		fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
		if n == 0 {
			continue
		}
		m, err := unix.Read(int(f.Fd()), buf)
		if err != nil {
			return err
		}
		if match(buf[:m]) {
			return nil
		}
	}
}

func ethernet(dst, src net.HardwareAddr, etherType uint16) []byte {
	b := append(append([]byte{}, dst...), src...)
	return binary.BigEndian.AppendUint16(b, etherType)
}

// udpFrame is one UDP/IPv4 datagram with an 8-byte payload, to the
// broadcast MAC (the program judges by addresses, not by the MAC asked).
func udpFrame(mac net.HardwareAddr, from, to netip.Addr, port uint16) []byte {
	payload := []byte("galactic")
	ip := make([]byte, 20, 20+8+len(payload))
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	copy(ip[12:], from.AsSlice())
	copy(ip[16:], to.AsSlice())
	binary.BigEndian.PutUint16(ip[10:], checksum(ip))
	udp := binary.BigEndian.AppendUint16(nil, 40000)
	udp = binary.BigEndian.AppendUint16(udp, port)
	udp = binary.BigEndian.AppendUint16(udp, uint16(8+len(payload)))
	udp = append(udp, 0, 0) // no checksum: allowed over IPv4
	frame := append(ethernet(broadcast, mac, 0x0800), ip...)
	return append(append(frame, udp...), payload...)
}

func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
