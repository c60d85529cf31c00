// Package fleet holds the fleet simulation benchmark (fleet_test.go): N
// simulated nodes, each running the daemon's informer source
// (kubeinventory.NewCluster) over a client and TCP connection of its own,
// against one real kube-apiserver and etcd holding M VPCAttachments and
// BGPAdvertisements. It has no test, only BenchmarkFleet: `make bench` runs
// the small sizes, `make bench-fleet` the large ones and writes
// bench/FLEET.md; docs/scale.md builds on its figures.
package fleet
