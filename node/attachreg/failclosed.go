package attachreg

import (
	"errors"
	"fmt"
	"os"

	ciliumlink "github.com/cilium/ebpf/link"
)

// detachWhenGone removes the pinned TCX link of ifindex once its device is
// gone, and keeps it while the device exists: with the interface's rows
// cleared, the program drops every frame of it (policy_unavailable), so a
// tenant tap is never unfiltered while it exists, whatever left it
// unregistered (a failed ADD, a teardown that failed after its rows). The
// teardown deletes the link first, so DEL, GC and the reclaim reach here with
// the device gone; the orphan collection clears pins of devices deleted
// behind the node's back. A link that is not pinned is already detached.
func (r *Registry) detachWhenGone(ifindex uint32) error {
	pin := r.linkPin(ifindex)
	l, err := ciliumlink.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("load tcx link %s: %w", pin, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return fmt.Errorf("tcx link %s: info: %w", pin, err)
	}
	// The kernel reports ifindex 0 for a TCX link whose device was deleted.
	if tcx := info.TCX(); tcx != nil && tcx.Ifindex != 0 {
		return nil
	}
	if err := l.Unpin(); err != nil {
		return fmt.Errorf("unpin tcx link %s: %w", pin, err)
	}
	return nil
}
