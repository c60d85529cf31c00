package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/datum-cloud/galactic-node/node/tun"
)

// readGroup is the --admin-read-group of the CLI tests; nobody is the
// other uid.
const (
	readGroup = 4242
	nobody    = 65534
)

// cliScene is a running daemon whose admin socket another uid can reach:
// the socket's folder and the binary are where uid 65534 can traverse and
// execute (the test's temp folders are 0700).
type cliScene struct {
	n   *node
	bin string
}

func newCLIScene(t *testing.T) *cliScene {
	t.Helper()
	n := newNode(t)
	dir, err := os.MkdirTemp("", "galactic-cli-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "galactic-node")
	data, err := os.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	n.socket = filepath.Join(dir, "admin.sock")
	n.tapAdd("1", "sandbox-1")
	n.stampedTap("G00000000a002H", "sandbox-2", tun.Mode{})
	_, log := n.start("--inventory-file", n.writeInventory(liveAttachment), "--admin-read-group", "4242")
	n.waitReady(log)
	return &cliScene{n: n, bin: bin}
}

// run runs the CLI as uid (0: root) with groups, and returns its exit code,
// stdout and stderr.
func (s *cliScene) run(t *testing.T, uid uint32, groups []uint32, args ...string) (int, string, string) {
	t.Helper()
	// The socket goes before positional arguments: flags end at the first.
	cmd := exec.Command(s.bin, append([]string{args[0], "--socket", s.n.socket}, args[1:]...)...)
	if uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: groups}}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, stdout.String(), stderr.String()
}

// Every subcommand, in both output forms, as root on the node with no
// token: tables a person reads, JSON a script parses.
func TestTheCLIAnswersRootWithNoToken(t *testing.T) {
	s := newCLIScene(t)
	ifindex := s.n.ifindex("G00000000a001H")
	for _, c := range []struct {
		args  []string
		table string // a string the table shows (or, empty, what stderr says)
	}{
		{[]string{"status"}, "ready:"},
		{[]string{"taps"}, "G00000000a002H"},
		{[]string{"pending"}, "No resources found"},
		{[]string{"passes"}, "No resources found"}, // no pass has run yet
		{[]string{"pass", "--dry-run"}, "RESULT"},
		{[]string{"pass"}, "completed"},
		{[]string{"maps"}, "traffic_policy"},
		{[]string{"rows", ifindex}, "program attached: true"},
		{[]string{"maps", "ifindex_vrf", "--ifindex", ifindex}, "KEY"},
	} {
		code, out, errOut := s.run(t, 0, nil, c.args...)
		if code != 0 || !strings.Contains(out+errOut, c.table) {
			t.Errorf("%v: exit %d, want 0 and %q in:\n%s%s", c.args, code, c.table, out, errOut)
		}
		code, out, errOut = s.run(t, 0, nil, append(c.args, "-o", "json")...)
		if code != 0 || !json.Valid([]byte(out)) {
			t.Errorf("%v -o json: exit %d, want 0 and JSON:\n%s%s", c.args, code, out, errOut)
		}
	}
	// The first pass marked the stale tap; the second removed it.
	if s.n.exists("G00000000a002H") {
		t.Error("two passes forced through the CLI left the stale tap")
	}
	var st struct {
		Version, Node string
		Ready         bool
		Schedule      struct{ Interval string }
		LastPass      struct{ Result string }
		Maps          []struct {
			Name       string
			MaxEntries int
		}
	}
	_, out, _ := s.run(t, 0, nil, "status", "-o", "json")
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Node != "node-a" || !st.Ready || st.Schedule.Interval != "0s" ||
		st.LastPass.Result != "completed" || len(st.Maps) == 0 || st.Maps[0].MaxEntries == 0 {
		t.Errorf("status -o json: %v %+v", err, st)
	}
}

// Another uid is refused; in the read group it reads but cannot force a
// pass, unless a token says it may.
func TestTheCLIRefusesOtherUsersUnlessTheReadGroupOrATokenAdmitsThem(t *testing.T) {
	s := newCLIScene(t)
	// The kernel refuses the connection: the socket is root's and the
	// read group's.
	if code, _, errOut := s.run(t, nobody, nil, "status"); code != 3 || !strings.Contains(errOut, "not allowed to connect") {
		t.Errorf("uid %d, no group: exit %d, %q; want 3, refused", nobody, code, errOut)
	}
	for _, args := range [][]string{{"status"}, {"taps"}, {"pending"}, {"passes"}, {"maps"}} {
		if code, out, errOut := s.run(t, nobody, []uint32{readGroup}, args...); code != 0 {
			t.Errorf("uid %d in the read group, %v: exit %d\n%s%s", nobody, args, code, out, errOut)
		}
	}
	if code, _, errOut := s.run(t, nobody, []uint32{readGroup}, "pass"); code != 3 || !strings.Contains(errOut, "needs root or an admin token") {
		t.Errorf("uid %d in the read group, pass: exit %d, %q; want 3, refused", nobody, code, errOut)
	}
	if reps := s.n.force(""); reps.Result != "completed" {
		t.Fatalf("a pass: %+v", reps)
	}
	// A token still counts, and says more than the group.
	tokenFile := filepath.Join(filepath.Dir(s.bin), "admin-token")
	if err := os.WriteFile(tokenFile, []byte(adminToken+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := s.run(t, nobody, []uint32{readGroup}, "pass", "--token-file", tokenFile); code != 0 {
		t.Errorf("uid %d in the read group with an admin token, pass: exit %d\n%s%s", nobody, code, out, errOut)
	}
}

// Usage errors exit 2 with one line and a hint; an unreachable daemon is
// exit 1.
func TestTheCLIsUsageErrorsAndAMissingDaemon(t *testing.T) {
	s := newCLIScene(t)
	for _, args := range [][]string{{"rows"}, {"rows", "x"}, {"rows", "0"}, {"taps", "one", "extra"}, {"taps", "-o", "yaml"}, {"pass", "--bogus"}} {
		code, out, errOut := s.run(t, 0, nil, args...)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code != 2 || out != "" || len(lines) != 2 || !strings.Contains(lines[1], "--help") {
			t.Errorf("%v: exit %d, stderr %q; want 2, one line and a hint", args, code, errOut)
		}
	}
	// The binary's conventions hold for the client too: help on stdout,
	// an unknown GALACTIC_* variable is a usage error.
	if out, err := exec.Command(s.bin, "status", "--help").Output(); err != nil || !strings.Contains(string(out), "exit codes") {
		t.Errorf("status --help: %v %q", err, out)
	}
	cmd := exec.Command(s.bin, "status", "--socket", s.n.socket)
	cmd.Env = append(os.Environ(), "GALACTIC_SOCKETT=/x")
	if out, err := cmd.CombinedOutput(); cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "GALACTIC_SOCKETT") {
		t.Errorf("an unknown GALACTIC_* variable: exit %d %v %q, want 2 naming it", cmd.ProcessState.ExitCode(), err, out)
	}
	code, _, errOut := s.run(t, 0, nil, "status", "--socket", filepath.Join(t.TempDir(), "none.sock"))
	if code != 1 || !strings.Contains(errOut, "none.sock") {
		t.Errorf("no daemon: exit %d %q, want 1 naming the socket", code, errOut)
	}
}
