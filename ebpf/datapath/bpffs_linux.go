package datapath

import "golang.org/x/sys/unix"

// isBPFFS reports whether dir is on a bpf filesystem: maps pinned anywhere
// else would not outlive the daemon.
func isBPFFS(dir string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, err
	}
	return st.Type == unix.BPF_FS_MAGIC, nil
}

// mountBPFFS mounts a bpf filesystem at dir, readable by root alone: pinned
// maps hold every tenant's rows.
func mountBPFFS(dir string) error {
	return unix.Mount("bpffs", dir, "bpf", 0, "mode=0700")
}
