package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/cnitap"
	"github.com/datum-cloud/galactic-node/node/reclaim/brakefile"
	"github.com/datum-cloud/galactic-node/node/vrf"
)

// defaultAdminSocket is --admin-socket's default.
const defaultAdminSocket = "/run/galactic/admin.sock"

// defaultBPFFS is --bpffs's default.
const defaultBPFFS = "/sys/fs/bpf"

// hostPathFlags are the flags of galactic-node run whose default is a host
// path the daemon writes: its pins, its layout record (which install-cni
// checks a new plugin against), the VRF locks it shares with the plugin,
// the plugin's records it removes, its socket and its brake memory.
func hostPathFlags(f *daemonFlags) []struct{ flag, value, def string } {
	return []struct{ flag, value, def string }{
		{"--bpffs", f.bpffs, defaultBPFFS},
		{"--layout-record", f.layoutRecord, datapath.DefaultLayoutRecord},
		{"--vrf-lock-dir", f.vrfLockDir, vrf.DefaultDir},
		{"--cni-data-dir", f.cniDataDir, cnitap.DefaultDataDir},
		{"--admin-socket", f.adminSocket, defaultAdminSocket},
		{"--brake-memory", f.brakeMemory, brakefile.DefaultPath},
	}
}

// refuseHostDefaultsOffHost refuses a daemon whose network namespace is not
// the host's while a flag writing host state is at its default. Such a
// daemon (a demo, a test, a lab) sees other taps than the host's daemon,
// and at the defaults it would overwrite that daemon's layout record,
// remove CNI records of taps it cannot see and share its brake: each must
// name a path of its own (or be empty, where that disables it), unless a
// mount namespace of the daemon's own puts another folder there
// (sharedWithHost). The host's namespace is PID 1's: in a container
// without hostPID, PID 1 is in the container's own namespace, which is
// then the host's as far as the paths it mounts are concerned. ok is false
// when it cannot tell (PID 1's namespace unreadable, and no kthreadd), and
// the caller says so.
func refuseHostDefaultsOffHost(f *daemonFlags) (ok bool, err error) {
	self, known := readable("/proc/self/ns/net")
	if !known {
		return false, nil
	}
	hostProc := "/proc/1"
	host, known := readable(hostProc + "/ns/net")
	if !known {
		// Where PID 1 is out of reach (a sandbox's init that even root may
		// not inspect), the kernel's thread parent is in the initial
		// namespace; in a PID namespace of its own, PID 2 is another
		// process, which its name tells apart.
		comm, _ := os.ReadFile("/proc/2/comm")
		if strings.TrimSpace(string(comm)) != "kthreadd" {
			return false, nil
		}
		hostProc = "/proc/2"
		if host, known = readable(hostProc + "/ns/net"); !known {
			return false, nil
		}
	}
	if os.SameFile(self, host) {
		return true, nil
	}
	var at []string
	for _, p := range hostPathFlags(f) {
		if p.value != "" && filepath.Clean(p.value) == p.def && sharedWithHost(p.def, hostProc+"/root") {
			at = append(at, p.flag+" "+p.def)
		}
	}
	if len(at) == 0 {
		return true, nil
	}
	return true, fmt.Errorf("this network namespace is not the host's (/proc/self/ns/net is not /proc/1/ns/net), and these flags are at their defaults, host paths another daemon owns: %s; give each a path of its own (empty disables --layout-record, --cni-data-dir, --admin-socket and --brake-memory)", strings.Join(at, ", "))
}

// sharedWithHost reports whether path, as this process sees it, is the
// host's: whether its nearest existing folder is the one the host sees
// there, read through hostRoot (/proc/<pid>/root of a process in the
// host's mount namespace). A folder bound over it in a mount namespace of
// the daemon's own (a test scene, a lab) is not the host's, and the
// default is then safe to use. Where the host's view cannot be read, the
// path counts as shared: the refusal errs towards the host.
func sharedWithHost(path, hostRoot string) bool {
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		ours, err := os.Stat(p)
		if err != nil {
			if p == "/" {
				return true
			}
			continue // not there yet: the folder it would be made in decides
		}
		theirs, err := os.Stat(filepath.Join(hostRoot, p))
		if err != nil {
			// There for the daemon and not for the host: its own, unless
			// the host's view is out of reach.
			return !errors.Is(err, fs.ErrNotExist)
		}
		return os.SameFile(ours, theirs)
	}
}

// readable stats a namespace file; false when it cannot be read, which
// only means the daemon cannot tell.
func readable(path string) (os.FileInfo, bool) {
	fi, err := os.Stat(path)
	return fi, err == nil
}
