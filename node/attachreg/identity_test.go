package attachreg_test

import (
	"encoding/json"
	"testing"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/identity"
)

// Rows are shown by the admin API and read by operators next to tap names:
// the datapath's own numbers must render exactly as the identities that
// name taps do, and translate both ways without loss.
func TestRowsRenderTheirTenantAsIdentitiesDo(t *testing.T) {
	ids := []identity.Identity{
		{VPC: 1, Attachment: 0},
		{VPC: 10, Attachment: 3},
		{VPC: 61, Attachment: 62},
		{VPC: 62, Attachment: 3843},
		{VPC: 0xdeadbeef, Attachment: 0x1234},
		{VPC: identity.MaxVPC, Attachment: identity.MaxAttachment},
	}
	for _, id := range ids {
		b := attachreg.VRFBinding(id, 1010)
		if got := attachreg.IdentityOf(b.VPC, b.Attachment); got != id {
			t.Errorf("binding of %v translates back to %v", id, got)
		}
		k := attachreg.DecisionKey(id, datapath.DecisionDeny)
		if got := attachreg.IdentityOf(k.VPC, k.Attachment); got != id || k.Decision != datapath.DecisionDeny {
			t.Errorf("decision key of %v translates back to %v, %v", id, got, k.Decision)
		}
		bj, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		want := `{"table":1010,"vpc":"` + id.VPC.Base62() + `","attachment":"` + id.Attachment.Base62() + `"}`
		if string(bj) != want {
			t.Errorf("binding of %v renders %s, want %s", id, bj, want)
		}
		kj, err := json.Marshal(k)
		if err != nil {
			t.Fatal(err)
		}
		want = `{"vpc":"` + id.VPC.Base62() + `","attachment":"` + id.Attachment.Base62() + `","decision":"deny"}`
		if string(kj) != want {
			t.Errorf("decision key of %v renders %s, want %s", id, kj, want)
		}
	}
	// The whole width of the datapath's numbers, beyond identity's 48 bits.
	for _, n := range []uint64{0, 9, 35, 36, 61, 62, 1<<48 - 1, 1 << 48, 1<<64 - 1} {
		got, _ := datapath.VPC(n).MarshalText()
		if want := identity.VPC(n).Base62(); string(got) != want {
			t.Errorf("datapath.VPC(%d) renders %q, identity %q", n, got, want)
		}
	}
}
