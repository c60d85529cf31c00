//go:build !linux

package datapath

import (
	"errors"
	"fmt"
)

// errNoBPFFS is what every bpf filesystem call answers off Linux: the package
// builds there (admin and its clients import its row types) but loads nothing.
var errNoBPFFS = fmt.Errorf("datapath: bpf filesystems are Linux-only: %w", errors.ErrUnsupported)

func isBPFFS(string) (bool, error) { return false, errNoBPFFS }

func mountBPFFS(string) error { return errNoBPFFS }
