package identity

import (
	"strconv"
	"strings"
)

// The readings here are for objects whose identity does not parse in full.
// Such an object carries no identity, yet it may be meant to carry one of a
// VPC it does name: whoever reads it keeps that VPC's taps, and only those,
// rather than trusting nothing (one tenant's typo would then halt every
// removal on every node) or nothing of it (the typo would cost a live tap).

// PartialBase62 returns the VPC that status fields as a VPCAttachment carries
// them still name when the identity as a whole does not parse: vpc parses
// and attachment does not. ok is false when vpc does not parse either: the
// fields then denote no identity at all.
func PartialBase62(vpc, attachment string) (v VPC, ok bool) {
	p, err := parseVPC(vpc)
	if err != nil {
		return 0, false
	}
	if _, err := parseAttachment(attachment); err == nil {
		return 0, false // the identity parses: not partial
	}
	return p, true
}

// PartialAdvertisementName returns the VPCs an advertisement name still names
// when ParseAdvertisementName refuses it: the name has the <vpc>-<attachment>
// shape and its VPC segment reads as a VPC in hex or in base62, while its
// attachment segment reads in neither encoding with it. A name of another
// shape ("web", "a-b-c") names no VPC.
func PartialAdvertisementName(name string) []VPC {
	if _, err := ParseAdvertisementName(name); err == nil {
		return nil
	}
	vpcSeg, attSeg, ok := strings.Cut(name, "-")
	if !ok || vpcSeg == "" || attSeg == "" || strings.Contains(attSeg, "-") {
		return nil
	}
	var vpcs []VPC
	if len(vpcSeg) <= maxRawLen && isLowerHex(vpcSeg) {
		if n, err := strconv.ParseUint(vpcSeg, 16, 64); err == nil && VPC(n).Valid() {
			vpcs = append(vpcs, VPC(n))
		}
	}
	if v, err := parseVPC(vpcSeg); err == nil && (len(vpcs) == 0 || vpcs[0] != v) {
		vpcs = append(vpcs, v)
	}
	return vpcs
}
