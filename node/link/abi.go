package link

// Numbers of the kernel's netlink and rtnetlink ABI, defined here rather than
// taken from golang.org/x/sys/unix, which has most of them only for Linux
// (and gives AF_INET6 another system's value elsewhere): building and
// decoding messages needs no syscall, so the package, and admin above it,
// builds on every system; only Dial fails there. abi_linux_test.go checks
// each against unix's value.
const (
	// include/uapi/linux/netlink.h
	netlinkRoute   = 0
	nlmsgError     = 0x2
	nlmsgDone      = 0x3
	nlmsgAlignTo   = 4
	sizeofNlMsghdr = 16

	// include/uapi/linux/rtnetlink.h
	rtmNewLink    = 16
	rtmDelLink    = 17
	rtmGetLink    = 18
	rtmNewRoute   = 24
	rtmGetRoute   = 26
	rtmNewQdisc   = 36
	rtTableUnspec = 0
	rtTableMain   = 254
	rtprotStatic  = 4
	rtScopeLink   = 253
	rtnUnicast    = 1

	// include/uapi/linux/if_link.h
	iflaGroup = 27

	// include/uapi/linux/rtnetlink.h (TCA_*) and pkt_sched.h
	tcaKind = 1
	tcHRoot = 0xFFFFFFFF

	// include/linux/socket.h: the address families netlink messages carry
	afUnspec = 0
	afInet   = 2
	afInet6  = 10
)
