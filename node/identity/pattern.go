package identity

import (
	"fmt"
	"strings"
)

// Admission (the CEL rules of deploy/crds and the ValidatingAdmissionPolicy
// of deploy/admission) refuses what the parsers of this package cannot read,
// so that a tenant cannot create an object whose identity the node daemon
// would never see. CEL has no base62 arithmetic, so the rules match regular
// expressions instead; the expressions below are generated from the same
// bounds the parsers use (MaxVPC, MaxAttachment, maxRawLen and the two
// alphabets), and TestAdmissionRulesHoldGeneratedPatterns asserts that the
// YAML holds exactly them. Change a bound here and that test prints the
// expressions to paste.
//
// They are RE2 (what CEL's matches() and Go's regexp both run), anchored, and
// bound the length themselves (1 to maxRawLen characters, leading zeros
// included), so each is equivalent to its parser on any string.

const hexAlphabet = "0123456789abcdef"

// The patterns are built when asked for, not at package init: every
// process that parses an identity (each CNI verb among them) would pay for
// them, and only the CRD tests and generators read them.
func vpcBase62() string { return numberPattern(base62Alphabet, uint64(MaxVPC), false, maxRawLen) }
func attachmentBase62() string {
	return numberPattern(base62Alphabet, uint64(MaxAttachment), true, maxRawLen)
}
func vpcHex() string { return numberPattern(hexAlphabet, uint64(MaxVPC), false, maxRawLen) }
func attachmentHex() string {
	return numberPattern(hexAlphabet, uint64(MaxAttachment), true, maxRawLen)
}

// VPCPattern matches exactly the strings ParseBase62 accepts as a VPC
// identifier: 1 to 16 base62 digits, leading zeros allowed, with a value from
// 1 to MaxVPC.
func VPCPattern() string { return "^" + vpcBase62() + "$" }

// AttachmentPattern matches exactly the strings ParseBase62 accepts as an
// attachment identifier: 1 to 16 base62 digits, leading zeros allowed, with a
// value from 0 to MaxAttachment.
func AttachmentPattern() string { return "^" + attachmentBase62() + "$" }

// AdvertisementNamePattern matches exactly the names ParseAdvertisementName
// accepts: <vpc>-<attachment> whose lower-case hex reading or raw base62
// reading is a valid identity.
func AdvertisementNamePattern() string {
	return "^(?:" + vpcHex() + "-" + attachmentHex() + "|" + vpcBase62() + "-" + attachmentBase62() + ")$"
}

// numberPattern returns an unanchored RE2 group matching the numerals over
// alphabet (digit i is alphabet[i]) that are 1 to maxLen characters long,
// leading zeros included, and whose value is 1..max, or 0..max when
// allowZero.
//
// It builds one alternative per count L of significant digits (those after
// the leading zeros): 0{0,maxLen-L} then L digits, the first non-zero. Below
// the digit count of max every such numeral is in range; at that count the
// numeral must not exceed max, which the usual digit-by-digit alternation
// expresses (see belowOrEqual).
func numberPattern(alphabet string, max uint64, allowZero bool, maxLen int) string {
	base := uint64(len(alphabet))
	var top []int // digits of max, most significant first
	for n := max; n > 0; n /= base {
		top = append([]int{int(n % base)}, top...)
	}
	if len(top) > maxLen {
		panic(fmt.Sprintf("identity: %d needs %d digits, more than %d", max, len(top), maxLen))
	}
	last := len(alphabet) - 1
	var alts []string
	if allowZero {
		alts = append(alts, repeat("0", 1, maxLen))
	}
	for l := 1; l < len(top); l++ {
		alts = append(alts, repeat("0", 0, maxLen-l)+class(alphabet, 1, last)+repeat(class(alphabet, 0, last), l-1, l-1))
	}
	alts = append(alts, repeat("0", 0, maxLen-len(top))+belowOrEqual(alphabet, top))
	return "(?:" + strings.Join(alts, "|") + ")"
}

// belowOrEqual matches the numerals of exactly len(top) digits, the first
// non-zero, whose value is at most that of top: for each position i, those
// that equal top up to i and are smaller at i (anything may follow), and top
// itself. Where top's remaining digits are all the largest digit, every
// numeral sharing its prefix is in range, so one class ends the alternation.
func belowOrEqual(alphabet string, top []int) string {
	last := len(alphabet) - 1
	digit := class(alphabet, 0, last)
	var alts []string
	prefix := ""
	for i, d := range top {
		lo := 0
		if i == 0 {
			lo = 1
		}
		rest := len(top) - 1 - i
		if allDigits(top[i:], last) {
			alts = append(alts, prefix+class(alphabet, lo, last)+repeat(digit, rest, rest))
			return group(alts)
		}
		if lo <= d-1 {
			alts = append(alts, prefix+class(alphabet, lo, d-1)+repeat(digit, rest, rest))
		}
		prefix += string(alphabet[d])
	}
	return group(append(alts, prefix))
}

func allDigits(ds []int, d int) bool {
	for _, x := range ds {
		if x != d {
			return false
		}
	}
	return true
}

func group(alts []string) string {
	if len(alts) == 1 {
		return alts[0]
	}
	return "(?:" + strings.Join(alts, "|") + ")"
}

// class returns a character class for the digits lo..hi of alphabet, ranges
// written over runs of consecutive characters (0-9, a-z, A-Z in base62); a
// single digit is written bare.
func class(alphabet string, lo, hi int) string {
	if lo == hi {
		return string(alphabet[lo])
	}
	var b strings.Builder
	b.WriteByte('[')
	for i := lo; i <= hi; {
		j := i
		for j+1 <= hi && alphabet[j+1] == alphabet[j]+1 {
			j++
		}
		switch j - i {
		case 0:
			b.WriteByte(alphabet[i])
		case 1:
			b.WriteByte(alphabet[i])
			b.WriteByte(alphabet[j])
		default:
			b.WriteByte(alphabet[i])
			b.WriteByte('-')
			b.WriteByte(alphabet[j])
		}
		i = j + 1
	}
	b.WriteByte(']')
	return b.String()
}

// repeat writes atom{min,max}, or nothing, atom or atom{n} where that is
// shorter.
func repeat(atom string, min, max int) string {
	switch {
	case max == 0:
		return ""
	case min == 1 && max == 1:
		return atom
	case min == max:
		return fmt.Sprintf("%s{%d}", atom, min)
	default:
		return fmt.Sprintf("%s{%d,%d}", atom, min, max)
	}
}
