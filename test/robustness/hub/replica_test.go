package hub

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The replicas' lease timing: shorter than the command's default (15 s),
// so that a fault's failover fits a short run many times over; still one
// Validate accepts, with the fence's margin of 1 s.
const (
	leaseDuration = 4 * time.Second
	renewDeadline = 3 * time.Second
	retryPeriod   = 300 * time.Millisecond
)

// replica is one galactic-hubctl of the pair, run as a Deployment would:
// started again whenever it exits (a SIGKILL, or leadership lost, on which
// the command exits by design), until the scene stops it.
type replica struct {
	id      string
	bin     string
	args    []string
	env     []string
	logPath string
	hist    *History

	mu      sync.Mutex
	proc    *os.Process
	stopped bool // SIGSTOP sent, no SIGCONT yet
	done    chan struct{}
}

func newReplica(id, bin, kubeconfig, platform, dir string, env []string, hist *History) *replica {
	return &replica{
		id: id, bin: bin, env: env, hist: hist, done: make(chan struct{}),
		logPath: filepath.Join(dir, id+".log"),
		args: []string{"--kubeconfig", kubeconfig, "--platform-namespace", platform, "--id", id,
			"--listen=", "--log-format", "json", "--workers", "4", "--placement", "none",
			"--leader-elect-lease-duration", leaseDuration.String(),
			"--leader-elect-renew-deadline", renewDeadline.String(),
			"--leader-elect-retry-period", retryPeriod.String()},
	}
}

// run keeps the replica running until ctx ends, then stops it with
// SIGTERM (SIGKILL after 20 s).
func (r *replica) run(ctx context.Context) {
	defer close(r.done)
	log, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		r.hist.Add(Event{Kind: KindNote, What: "replica log", Replica: r.id, Err: err.Error()})
		return
	}
	defer log.Close()
	for ctx.Err() == nil {
		cmd := exec.Command(r.bin, r.args...)
		cmd.Env, cmd.Stdout, cmd.Stderr = r.env, log, log
		if err := cmd.Start(); err != nil {
			r.hist.Add(Event{Kind: KindFault, What: "start", Replica: r.id, Err: err.Error()})
			return
		}
		r.mu.Lock()
		r.proc, r.stopped = cmd.Process, false
		r.mu.Unlock()
		r.hist.Add(Event{Kind: KindFault, What: "start", Replica: r.id, Detail: fmt.Sprintf("pid %d", cmd.Process.Pid)})
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		select {
		case err := <-exited:
			r.hist.Add(Event{Kind: KindFault, What: "exit", Replica: r.id, Err: errString(err)})
		case <-ctx.Done():
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Signal(syscall.SIGTERM)
			var err error
			select {
			case err = <-exited:
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Kill()
				err = <-exited
			}
			r.hist.Add(Event{Kind: KindNote, What: "stopped", Replica: r.id, Err: errString(err)})
			return
		}
		r.mu.Lock()
		r.proc = nil
		r.mu.Unlock()
		// A pod's restart, a moment later.
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// signal sends sig to the running process; false when none runs.
func (r *replica) signal(sig syscall.Signal) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil || r.proc.Signal(sig) != nil {
		return false
	}
	switch sig {
	case syscall.SIGSTOP:
		r.stopped = true
	case syscall.SIGCONT, syscall.SIGKILL:
		r.stopped = false
	}
	return true
}

// resume sends SIGCONT if the replica was stopped.
func (r *replica) resume() {
	r.mu.Lock()
	stopped := r.stopped
	r.mu.Unlock()
	if stopped && r.signal(syscall.SIGCONT) {
		r.hist.Add(Event{Kind: KindFault, What: "sigcont", Replica: r.id})
	}
}

// replicaEnv is the test's environment without the binaries' own
// variables and the harness's knobs (the binaries refuse a GALACTIC_*
// variable that is no flag's), with variant, when set, as the one break.
func replicaEnv(variant string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GALACTIC_") && !strings.HasPrefix(kv, "GALACTICTEST_") {
			env = append(env, kv)
		}
	}
	if variant != "" {
		env = append(env, "GALACTICTEST_HUB_BREAK="+variant)
	}
	return env
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
