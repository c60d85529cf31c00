// Package identity names a tenant attachment: the 48-bit VPC identifier and the
// 16-bit attachment identifier that together say which tenant a tap serves.
//
// Interface names carry identifiers in base62 (0-9, a-z, A-Z), zero-padded to
// fixed widths: a tap is G<vpc:9><attachment:3>H and a VRF is G<vpc:9>V.
// BGPAdvertisement object names carry them as <vpc>-<attachment> in lower-case
// hex, or, on objects written before that encoding, in raw base62.
//
// Every parser here refuses malformed input with an error wrapping ErrMalformed;
// none returns the zero Identity on success, because VPC 0 is not a valid
// identifier. Callers that decide whether a kernel object may be removed rely on
// that: a name that does not parse is never attributed to a tenant.
package identity

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrMalformed is wrapped by every error that reports input that does not
// denote a valid identity.
var ErrMalformed = errors.New("malformed tenant identity")

const (
	// MaxVPC is the largest VPC identifier: identifiers are 48 bits wide.
	MaxVPC VPC = 1<<48 - 1
	// MaxAttachment is the largest attachment identifier (16 bits).
	MaxAttachment Attachment = 1<<16 - 1

	vpcWidth        = 9
	attachmentWidth = 3
	// maxRawLen bounds identifiers carried in object fields (status.vpc and
	// advertisement names): the cluster objects allow up to 16 characters.
	maxRawLen = 16

	tapPrefix, tapSuffix = "G", "H"
	vrfPrefix, vrfSuffix = "G", "V"

	// TapNameLen and VRFNameLen are the lengths of well-formed names; both fit
	// IFNAMSIZ-1 (15).
	TapNameLen = len(tapPrefix) + vpcWidth + attachmentWidth + len(tapSuffix)
	VRFNameLen = len(vrfPrefix) + vpcWidth + len(vrfSuffix)
)

// VPC is a VPC identifier. The zero value is not a valid identifier.
type VPC uint64

// Attachment is an attachment identifier within a VPC.
type Attachment uint16

// Identity is the (VPC, attachment) pair a tenant tap serves. Its JSON
// keys are lower-camel like every other key the admin API writes; decoding
// matches keys case-insensitively, so JSON written before (VPC, Attachment)
// still reads.
type Identity struct {
	VPC        VPC        `json:"vpc"`
	Attachment Attachment `json:"attachment"`
}

// Valid reports whether v is a usable VPC identifier: non-zero and 48 bits.
func (v VPC) Valid() bool { return v != 0 && v <= MaxVPC }

// Base62 returns the identifier in base62 without padding.
func (v VPC) Base62() string { return formatBase62(uint64(v), 0) }

// VRFName returns the name of the VPC's VRF device, G<vpc:9>V.
func (v VPC) VRFName() string { return vrfPrefix + formatBase62(uint64(v), vpcWidth) + vrfSuffix }

// String returns the base62 form, as cluster objects carry it.
func (v VPC) String() string { return v.Base62() }

// Base62 returns the identifier in base62 without padding.
func (a Attachment) Base62() string { return formatBase62(uint64(a), 0) }

// String returns the base62 form, as cluster objects carry it.
func (a Attachment) String() string { return a.Base62() }

// Valid reports whether id can name a tap.
func (id Identity) Valid() bool { return id.VPC.Valid() }

// TapName returns the name of the identity's tap, G<vpc:9><attachment:3>H.
func (id Identity) TapName() string {
	return tapPrefix + formatBase62(uint64(id.VPC), vpcWidth) +
		formatBase62(uint64(id.Attachment), attachmentWidth) + tapSuffix
}

// VRFName returns the name of the VRF the identity's tap is enslaved to.
func (id Identity) VRFName() string { return id.VPC.VRFName() }

// AdvertisementName returns the BGPAdvertisement object name for the
// identity in its current encoding: lower-case hex, no padding ("3e-41").
func (id Identity) AdvertisementName() string {
	return strconv.FormatUint(uint64(id.VPC), 16) + "-" + strconv.FormatUint(uint64(id.Attachment), 16)
}

// String returns "<vpc>/<attachment>" in base62, for logs.
func (id Identity) String() string { return id.VPC.Base62() + "/" + id.Attachment.Base62() }

// ParseTapName parses a tenant tap name, G<vpc:9><attachment:3>H.
func ParseTapName(name string) (Identity, error) {
	if len(name) != TapNameLen || !strings.HasPrefix(name, tapPrefix) || !strings.HasSuffix(name, tapSuffix) {
		return Identity{}, fmt.Errorf("tap name %q: want G<vpc:9><attachment:3>H: %w", name, ErrMalformed)
	}
	body := name[len(tapPrefix) : len(name)-len(tapSuffix)]
	vpc, err := parseVPC(body[:vpcWidth])
	if err != nil {
		return Identity{}, fmt.Errorf("tap name %q: %w", name, err)
	}
	att, err := parseAttachment(body[vpcWidth:])
	if err != nil {
		return Identity{}, fmt.Errorf("tap name %q: %w", name, err)
	}
	return Identity{VPC: vpc, Attachment: att}, nil
}

// ParseVRFName parses a VRF name, G<vpc:9>V.
func ParseVRFName(name string) (VPC, error) {
	if len(name) != VRFNameLen || !strings.HasPrefix(name, vrfPrefix) || !strings.HasSuffix(name, vrfSuffix) {
		return 0, fmt.Errorf("vrf name %q: want G<vpc:9>V: %w", name, ErrMalformed)
	}
	vpc, err := parseVPC(name[len(vrfPrefix) : len(name)-len(vrfSuffix)])
	if err != nil {
		return 0, fmt.Errorf("vrf name %q: %w", name, err)
	}
	return vpc, nil
}

// ParseBase62 parses the identity as VPCAttachment status carries it: the VPC
// and attachment identifiers in base62, each at most 16 characters, leading
// zeros allowed.
func ParseBase62(vpc, attachment string) (Identity, error) {
	v, err := parseVPC(vpc)
	if err != nil {
		return Identity{}, err
	}
	a, err := parseAttachment(attachment)
	if err != nil {
		return Identity{}, err
	}
	return Identity{VPC: v, Attachment: a}, nil
}

// ParseAdvertisementName returns every identity a BGPAdvertisement name
// <vpc>-<attachment> can denote: its lower-case hex reading and, for objects
// written before that encoding, its raw base62 reading. A name such as "10-13"
// is valid in both and denotes two identities; callers that keep whatever an
// advertisement carries must keep both, since the name alone cannot tell which
// encoding wrote it. The result is never empty when err is nil.
func ParseAdvertisementName(name string) ([]Identity, error) {
	vpcSeg, attSeg, ok := strings.Cut(name, "-")
	if !ok || vpcSeg == "" || attSeg == "" || strings.Contains(attSeg, "-") {
		return nil, fmt.Errorf("advertisement name %q: want <vpc>-<attachment>: %w", name, ErrMalformed)
	}
	var ids []Identity
	if id, err := parseHexPair(vpcSeg, attSeg); err == nil {
		ids = append(ids, id)
	}
	if id, err := ParseBase62(vpcSeg, attSeg); err == nil && (len(ids) == 0 || ids[0] != id) {
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("advertisement name %q: neither hex nor base62 identifiers: %w", name, ErrMalformed)
	}
	return ids, nil
}

func parseHexPair(vpcSeg, attSeg string) (Identity, error) {
	if len(vpcSeg) > maxRawLen || len(attSeg) > maxRawLen || !isLowerHex(vpcSeg) || !isLowerHex(attSeg) {
		return Identity{}, ErrMalformed
	}
	v, err := strconv.ParseUint(vpcSeg, 16, 64)
	if err != nil || !VPC(v).Valid() {
		return Identity{}, ErrMalformed
	}
	a, err := strconv.ParseUint(attSeg, 16, 16)
	if err != nil {
		return Identity{}, ErrMalformed
	}
	return Identity{VPC: VPC(v), Attachment: Attachment(a)}, nil
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func parseVPC(s string) (VPC, error) {
	n, err := parseBase62(s, uint64(MaxVPC))
	if err != nil {
		return 0, fmt.Errorf("vpc %q: %w", s, err)
	}
	if n == 0 {
		return 0, fmt.Errorf("vpc %q: identifier 0 is reserved: %w", s, ErrMalformed)
	}
	return VPC(n), nil
}

func parseAttachment(s string) (Attachment, error) {
	n, err := parseBase62(s, uint64(MaxAttachment))
	if err != nil {
		return 0, fmt.Errorf("attachment %q: %w", s, err)
	}
	return Attachment(n), nil
}

// MarshalText writes the identifier in base62, so JSON shows what names carry.
func (v VPC) MarshalText() ([]byte, error) { return []byte(v.Base62()), nil }

// UnmarshalText parses base62, refusing what ParseBase62 refuses.
func (v *VPC) UnmarshalText(b []byte) error {
	p, err := parseVPC(string(b))
	if err != nil {
		return err
	}
	*v = p
	return nil
}

// MarshalText writes the identifier in base62.
func (a Attachment) MarshalText() ([]byte, error) { return []byte(a.Base62()), nil }

// UnmarshalText parses base62.
func (a *Attachment) UnmarshalText(b []byte) error {
	p, err := parseAttachment(string(b))
	if err != nil {
		return err
	}
	*a = p
	return nil
}
