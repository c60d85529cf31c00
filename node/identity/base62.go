package identity

import "fmt"

const base62Alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

// formatBase62 writes n in base62, left-padded with '0' to width.
func formatBase62(n uint64, width int) string {
	var buf [16]byte // 62^11 > 2^64, so 11 digits always suffice
	i := len(buf)
	for {
		i--
		buf[i] = base62Alphabet[n%62]
		n /= 62
		if n == 0 {
			break
		}
	}
	for len(buf)-i < width {
		i--
		buf[i] = '0'
	}
	return string(buf[i:])
}

// parseBase62 parses 1 to maxRawLen base62 digits and refuses values above max.
func parseBase62(s string, max uint64) (uint64, error) {
	if s == "" || len(s) > maxRawLen {
		return 0, fmt.Errorf("want 1 to %d base62 digits, got %d: %w", maxRawLen, len(s), ErrMalformed)
	}
	var n uint64
	for i := 0; i < len(s); i++ {
		d, ok := base62Digit(s[i])
		if !ok {
			return 0, fmt.Errorf("%q is not a base62 digit: %w", s[i], ErrMalformed)
		}
		// n*62+d > max, checked without overflowing.
		if n > (max-d)/62 {
			return 0, fmt.Errorf("value exceeds %d: %w", max, ErrMalformed)
		}
		n = n*62 + d
	}
	return n, nil
}

func base62Digit(c byte) (uint64, bool) {
	switch {
	case c >= '0' && c <= '9':
		return uint64(c - '0'), true
	case c >= 'a' && c <= 'z':
		return uint64(c-'a') + 10, true
	case c >= 'A' && c <= 'Z':
		return uint64(c-'A') + 36, true
	}
	return 0, false
}
