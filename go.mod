module github.com/datum-cloud/galactic-node

go 1.26.0

require (
	github.com/jsimonetti/rtnetlink/v2 v2.3.0
	github.com/mdlayher/netlink v1.11.2
	golang.org/x/sys v0.50.0
)

require (
	github.com/cilium/ebpf v0.22.0 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/mdlayher/socket v0.6.0 // indirect
	golang.org/x/net v0.55.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
)

tool github.com/cilium/ebpf/cmd/bpf2go
