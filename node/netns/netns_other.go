//go:build !linux

package netns

import (
	"errors"
	"fmt"
	"os"
)

// Do runs fn where the caller is when ns is nil, as on Linux; any other ns
// is an error wrapping errors.ErrUnsupported, since only Linux has network
// namespaces to enter.
func Do(ns *os.File, fn func() error) error {
	if ns == nil {
		return fn()
	}
	return fmt.Errorf("netns: enter %s: network namespaces are Linux-only: %w", ns.Name(), errors.ErrUnsupported)
}
