// Package robustness runs the whole node together under random work and
// random faults, records everything that happened as a history, and checks
// the history afterwards, as etcd's robustness suite does
// (etcd-io/etcd tests/robustness): the built galactic-node daemon with its
// admin API, the built galactic-tap driven through libcni as a runtime
// drives it, processes holding taps as VMMs do, and a real kube-apiserver
// and etcd holding VPCAttachments. What broke before lay between processes
// (state one left and another read), where no package's own test looks.
//
// The history is a file of JSON lines (History); Check judges it against
// the node's rules without asking any process: safety (no tap removed while
// held, while its identity was carried, before the minimum age, or while
// the brake held it), accounting (every removal in exactly one pass
// report, visible as it happens), liveness and quiescence once faults stop,
// and the brake the same across every restart. docs/robustness.md says how
// to run it longer and lists what it found.
package robustness
