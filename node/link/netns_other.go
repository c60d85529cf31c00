//go:build !linux

package link

import "errors"

// socketNetNS has no meaning off Linux; it exists so the packages that read
// this one's types (the admin and hub views) type-check everywhere.
func socketNetNS(uintptr) (int, error) {
	return -1, errors.New("SIOCGSKNS: network namespaces are a Linux feature")
}
