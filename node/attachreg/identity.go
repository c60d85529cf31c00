package attachreg

import (
	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/identity"
)

// The datapath speaks in its own numbers (datapath.VPC, datapath.Attachment)
// and knows nothing of tenant identities; this is the one place that
// translates between the two, for every row this package writes or reads.

// VRFBinding is the ifindex_vrf row that routes an interface of id through
// the VRF's table.
func VRFBinding(id identity.Identity, table uint32) datapath.VRFBinding {
	return datapath.VRFBinding{Table: table, VPC: datapath.VPC(id.VPC), Attachment: datapath.Attachment(id.Attachment)}
}

// DecisionKey is the decisions key that counts d against id.
func DecisionKey(id identity.Identity, d datapath.Decision) datapath.DecisionKey {
	return datapath.DecisionKey{VPC: datapath.VPC(id.VPC), Attachment: datapath.Attachment(id.Attachment), Decision: d}
}

// IdentityOf is the identity a row's (VPC, attachment) numbers name. A VPC
// above identity.MaxVPC is not a valid identity (Valid says so); no row this
// package writes carries one.
func IdentityOf(vpc datapath.VPC, a datapath.Attachment) identity.Identity {
	return identity.Identity{VPC: identity.VPC(vpc), Attachment: identity.Attachment(a)}
}
