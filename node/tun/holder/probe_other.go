//go:build !linux

package holder

import (
	"context"
	"errors"

	"github.com/datum-cloud/galactic-node/node/link"
)

var errLinuxOnly = errors.New("probing taps is Linux-only")

// Claim cannot ask any kernel but Linux's: it claims nothing, so every
// tap is kept.
func (p Prober) Claim(context.Context, link.Tap) (*Claim, error) { return nil, errLinuxOnly }

// CanProbe reports that probing is Linux-only.
func CanProbe() error { return errLinuxOnly }
