package hubctl

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// ClaimPrefix starts the name of every claim this controller owns. A claim
// not named so is never read for release, let alone deleted.
const ClaimPrefix = "fabric-identity."

// maxNameLen is the longest object name the API server accepts.
const maxNameLen = 253

// ErrBadBlock is wrapped by errors for an allocated block that yields no
// identity: unparseable, not a /64, or identity 0.
var ErrBadBlock = errors.New("allocated block yields no fabric identity")

// ClaimName is the IPClaim that holds the fabric identity of network
// namespace/name: fabric-identity.<namespace>.<name>, or, when that exceeds
// 253 characters, fabric-identity.<sha256 of "namespace/name" in hex>.
// Claims carry the network's namespace and name in annotations too, since a
// hashed name cannot be read back.
func ClaimName(namespace, name string) string {
	n := ClaimPrefix + namespace + "." + name
	if len(n) <= maxNameLen {
		return n
	}
	sum := sha256.Sum256([]byte(namespace + "/" + name))
	return ClaimPrefix + hex.EncodeToString(sum[:])
}

// AllocationName is the IPAllocation the address service binds to the
// claim namespace/name: alloc- and the hex of the first 8 bytes of
// sha256("<namespace>/<name>"). A claim re-created under the same name
// meets its own retained allocation.
func AllocationName(namespace, name string) string {
	sum := sha256.Sum256([]byte(namespace + "/" + name))
	return "alloc-" + hex.EncodeToString(sum[:8])
}

// NetworkOfClaim reads back the network a claim name was made for, when
// the name is not hashed. Namespaces hold no dots, so the first dot after
// the prefix ends the namespace.
func NetworkOfClaim(claim string) (namespace, name string, ok bool) {
	rest, found := strings.CutPrefix(claim, ClaimPrefix)
	if !found {
		return "", "", false
	}
	namespace, name, ok = strings.Cut(rest, ".")
	return namespace, name, ok && namespace != "" && name != ""
}

// FabricIDFromBlock derives the fabric ID from an allocated /64: the 32
// bits between /32 and /64. Fabric ID 0 is refused.
func FabricIDFromBlock(cidr string) (uint32, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return 0, fmt.Errorf("block %q: %w: %w", cidr, ErrBadBlock, err)
	}
	if !p.Addr().Is6() || p.Addr().Is4In6() || p.Bits() != 64 {
		return 0, fmt.Errorf("block %q: want an IPv6 /64: %w", cidr, ErrBadBlock)
	}
	b := p.Masked().Addr().As16()
	id := binary.BigEndian.Uint32(b[4:8])
	if id == 0 {
		return 0, fmt.Errorf("block %q: identity 0 is refused: %w", cidr, ErrBadBlock)
	}
	return id, nil
}
