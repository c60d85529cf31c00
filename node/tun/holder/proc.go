package holder

// Proc scans a procfs for descriptors of /dev/net/tun and reads which tap
// each is attached to from its fdinfo (`iff: NAME`). Threads that unshared
// their descriptor table are read too. The scan is Linux's (proc_linux.go);
// elsewhere it is never complete, so it proves no tap free.
type Proc struct {
	// Root is the procfs mount, normally "/proc".
	Root string
}
