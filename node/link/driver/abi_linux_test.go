package driver

import (
	"testing"

	"golang.org/x/sys/unix"
)

// The local copies of the kernel's numbers in abi.go must be the kernel's:
// unix's are generated from the headers.
func TestABIConstantsMatchUnix(t *testing.T) {
	for _, c := range []struct {
		name          string
		local, kernel int
	}{
		{"IFF_TUN", iffTun, unix.IFF_TUN},
		{"IFF_TAP", iffTap, unix.IFF_TAP},
		{"IFLA_TUN_OWNER", iflaTunOwner, unix.IFLA_TUN_OWNER},
		{"IFLA_TUN_GROUP", iflaTunGroup, unix.IFLA_TUN_GROUP},
		{"IFLA_TUN_TYPE", iflaTunType, unix.IFLA_TUN_TYPE},
		{"IFLA_TUN_PI", iflaTunPI, unix.IFLA_TUN_PI},
		{"IFLA_TUN_VNET_HDR", iflaTunVnetHdr, unix.IFLA_TUN_VNET_HDR},
		{"IFLA_TUN_PERSIST", iflaTunPersist, unix.IFLA_TUN_PERSIST},
		{"IFLA_TUN_MULTI_QUEUE", iflaTunMultiQueue, unix.IFLA_TUN_MULTI_QUEUE},
		{"IFLA_TUN_NUM_QUEUES", iflaTunNumQueues, unix.IFLA_TUN_NUM_QUEUES},
		{"IFLA_TUN_NUM_DISABLED_QUEUES", iflaTunNumDisabledQueues, unix.IFLA_TUN_NUM_DISABLED_QUEUES},
		{"IFLA_VRF_TABLE", iflaVRFTable, unix.IFLA_VRF_TABLE},
	} {
		if c.local != c.kernel {
			t.Errorf("%s: local %d, unix %d", c.name, c.local, c.kernel)
		}
	}
}
