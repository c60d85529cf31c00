//go:build !linux

package holder

import "context"

// Scan proves nothing off Linux: there is no /dev/net/tun to hold, and
// procfs, where it exists, has no fdinfo naming a tap. An incomplete scan
// keeps every single-queue tap held.
func (p Proc) Scan(context.Context) Scan {
	return Scan{why: "scanning processes for tap holders is Linux-only"}
}
