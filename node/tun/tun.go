// Package tun drives /dev/net/tun: it creates tap devices, attaches and
// detaches their queues, and makes them persistent. rtnetlink cannot create a
// tun device (the kernel answers EOPNOTSUPP), so these ioctls are the only way.
//
// A device is created in the network namespace of the thread that opens
// /dev/net/tun; Open takes the namespace for that reason. Once open, the file
// can be used from any thread.
package tun

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/node/netns"
)

const cloneDevice = "/dev/net/tun"

// Mode chooses how a tap is opened.
type Mode struct {
	// SingleQueue opens a classic single-queue tap. The default, multiqueue,
	// lets the kernel report queue counts, which is how holders are detected.
	SingleQueue bool
	// PacketInfo and VnetHdr are the tap's header features. The plugin
	// makes taps with neither; a probe attaching to an existing tap passes
	// what the tap has, because the first queue's TUNSETIFF rewrites them.
	PacketInfo bool
	VnetHdr    bool
}

func (m Mode) flags() uint16 {
	f := uint16(unix.IFF_TAP)
	if !m.PacketInfo {
		f |= unix.IFF_NO_PI
	}
	if m.VnetHdr {
		f |= unix.IFF_VNET_HDR
	}
	if !m.SingleQueue {
		f |= unix.IFF_MULTI_QUEUE
	}
	return f
}

// Open attaches a new queue to the tap called name in namespace ns (nil: the
// caller's), creating the tap if it does not exist. The returned file holds
// the queue until it is closed. Opening an existing tap with a different
// queue mode fails with EINVAL; opening a single-queue tap that a file
// already holds fails with EBUSY (drivers/net/tun.c, tun_attach), whichever
// process or socket holds that file.
func Open(ns *os.File, name string, mode Mode) (*os.File, error) {
	var f *os.File
	err := netns.Do(ns, func() error {
		fd, err := unix.Open(cloneDevice, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", cloneDevice, err)
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("tap name %q: %w", name, err)
		}
		ifr.SetUint16(mode.flags())
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return fmt.Errorf("TUNSETIFF %s: %w", name, err)
		}
		f = os.NewFile(uintptr(fd), cloneDevice+":"+name)
		return nil
	})
	return f, err
}

// SetPersist keeps the device after its last file closes (on) or lets it go
// with its last file (off).
func SetPersist(f *os.File, on bool) error {
	v := 0
	if on {
		v = 1
	}
	if err := unix.IoctlSetInt(int(f.Fd()), unix.TUNSETPERSIST, v); err != nil {
		return fmt.Errorf("TUNSETPERSIST %s: %w", f.Name(), err)
	}
	return nil
}

// SetOwner lets uid attach queues without CAP_NET_ADMIN.
func SetOwner(f *os.File, uid uint32) error {
	if err := unix.IoctlSetInt(int(f.Fd()), unix.TUNSETOWNER, int(uid)); err != nil {
		return fmt.Errorf("TUNSETOWNER %s: %w", f.Name(), err)
	}
	return nil
}

// SetGroup lets members of gid attach queues without CAP_NET_ADMIN.
func SetGroup(f *os.File, gid uint32) error {
	if err := unix.IoctlSetInt(int(f.Fd()), unix.TUNSETGROUP, int(gid)); err != nil {
		return fmt.Errorf("TUNSETGROUP %s: %w", f.Name(), err)
	}
	return nil
}

// DetachQueue disables f's queue of a multiqueue tap while f stays open; the
// kernel then counts it as a disabled queue.
func DetachQueue(f *os.File) error { return setQueue(f, unix.IFF_DETACH_QUEUE) }

// AttachQueue enables a queue that DetachQueue disabled.
func AttachQueue(f *os.File) error { return setQueue(f, unix.IFF_ATTACH_QUEUE) }

func setQueue(f *os.File, flag uint16) error {
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return err
	}
	ifr.SetUint16(flag)
	if err := unix.IoctlIfreq(int(f.Fd()), unix.TUNSETQUEUE, ifr); err != nil {
		return fmt.Errorf("TUNSETQUEUE %s: %w", f.Name(), err)
	}
	return nil
}

// CanOpen reports whether the clone device opens, without attaching to or
// creating any tap.
func CanOpen() error {
	fd, err := unix.Open(cloneDevice, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", cloneDevice, err)
	}
	return unix.Close(fd)
}
