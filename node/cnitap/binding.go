package cnitap

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/datum-cloud/galactic-node/node/attachreg"
)

// Registration is what ADD registers for an attachment run with conf (the
// plugin's configuration as the runtime passed it on stdin) and the CNI_ARGS
// args, for containerID's interface ifName: the node daemon rebuilds an
// older build's registration from the runtime's record of its ADD with it,
// so that the row it writes is the one this build's ADD (and CHECK) would.
// A configuration ADD would refuse is refused here with the same error.
func Registration(conf []byte, args, containerID, ifName string) (attachreg.Registration, error) {
	inv, err := parse(&skel.CmdArgs{ContainerID: containerID, IfName: ifName, Args: args, StdinData: conf}, cmdCheck)
	if err != nil {
		return attachreg.Registration{}, fmt.Errorf("registration of %s %s: %w", containerID, ifName, err)
	}
	return inv.reg, nil
}

// Record is the plugin's note of one ADD: the network it was made for and
// the attachment (container and interface) it serves.
type Record struct {
	Network, Tap, ContainerID, IfName string
}

// RecordsOfTap returns every network's record of tap under dataDir that
// carries stamp (the tap's owner, the container its ADD was for): a record
// of a tap another container took over since speaks for nothing.
func RecordsOfTap(dataDir, tap, stamp string) ([]Record, error) {
	recs, err := recordsOfTap(dataDir, tap)
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, r := range recs {
		if r.speaksFor(stamp) {
			out = append(out, Record{Network: r.Network, Tap: r.Tap, ContainerID: r.ContainerID, IfName: r.IfName})
		}
	}
	return out, nil
}
