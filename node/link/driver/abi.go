package driver

// Attribute numbers and flags of the kernel's rtnetlink ABI, defined here
// rather than taken from golang.org/x/sys/unix, which has them only for
// Linux: decoding a message needs no syscall, so the package (and what
// imports it) builds on every system. abi_linux_test.go checks each against
// unix's value.
const (
	// include/uapi/linux/if_tun.h
	iffTun = 0x0001
	iffTap = 0x0002

	// include/uapi/linux/if_link.h, enum IFLA_TUN_*
	iflaTunOwner             = 1
	iflaTunGroup             = 2
	iflaTunType              = 3
	iflaTunPI                = 4
	iflaTunVnetHdr           = 5
	iflaTunPersist           = 6
	iflaTunMultiQueue        = 7
	iflaTunNumQueues         = 8
	iflaTunNumDisabledQueues = 9

	// include/uapi/linux/if_link.h, enum IFLA_VRF_*
	iflaVRFTable = 1
)
