package link

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
		{"NETLINK_ROUTE", netlinkRoute, unix.NETLINK_ROUTE},
		{"NLMSG_ERROR", nlmsgError, unix.NLMSG_ERROR},
		{"NLMSG_DONE", nlmsgDone, unix.NLMSG_DONE},
		{"NLMSG_ALIGNTO", nlmsgAlignTo, unix.NLMSG_ALIGNTO},
		{"SizeofNlMsghdr", sizeofNlMsghdr, unix.SizeofNlMsghdr},
		{"RTM_NEWLINK", rtmNewLink, unix.RTM_NEWLINK},
		{"RTM_DELLINK", rtmDelLink, unix.RTM_DELLINK},
		{"RTM_GETLINK", rtmGetLink, unix.RTM_GETLINK},
		{"RTM_NEWROUTE", rtmNewRoute, unix.RTM_NEWROUTE},
		{"RTM_GETROUTE", rtmGetRoute, unix.RTM_GETROUTE},
		{"RT_TABLE_UNSPEC", rtTableUnspec, unix.RT_TABLE_UNSPEC},
		{"RT_TABLE_MAIN", rtTableMain, unix.RT_TABLE_MAIN},
		{"RTPROT_STATIC", rtprotStatic, unix.RTPROT_STATIC},
		{"RT_SCOPE_LINK", rtScopeLink, unix.RT_SCOPE_LINK},
		{"RTN_UNICAST", rtnUnicast, unix.RTN_UNICAST},
		{"IFLA_GROUP", iflaGroup, unix.IFLA_GROUP},
		{"RTM_NEWQDISC", rtmNewQdisc, unix.RTM_NEWQDISC},
		{"TCA_KIND", tcaKind, unix.TCA_KIND},
		{"AF_UNSPEC", afUnspec, unix.AF_UNSPEC},
		{"AF_INET", afInet, unix.AF_INET},
		{"AF_INET6", afInet6, unix.AF_INET6},
	} {
		if c.local != c.kernel {
			t.Errorf("%s: local %d, unix %d", c.name, c.local, c.kernel)
		}
	}
}
