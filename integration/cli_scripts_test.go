package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The client commands script as kubectl does (issue 51): one JSON schema,
// kubectl's errors and empty results, and help per command.

// lowerCamel is the form of every key the client's JSON writes.
var lowerCamel = regexp.MustCompile(`^[a-z][a-zA-Z0-9]*$`)

// dataKeys are the objects whose keys are data, not schema: a map of the
// daemon's eBPF map names, of decision names, or a row's own fields
// (the kernel's struct, named as the program's C source names them).
var dataKeys = map[string]bool{"rows": true, "decisions": true, "key": true, "value": true}

// nullable are the keys whose null says something other than "none":
// unknown (decisions: the counters could not be read) or absent.
var nullable = map[string]bool{"decisions": true}

// checkSchema walks v, found at path, and reports a key that is not
// lower-camel and a null where a list or object belongs.
func checkSchema(t *testing.T, what, path string, v any) {
	t.Helper()
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if !lowerCamel.MatchString(k) {
				t.Errorf("%s: key %s.%s is not lower-camel", what, path, k)
			}
			if e == nil && !nullable[k] {
				t.Errorf("%s: %s.%s is null; an empty list is [], and a key with nothing to say is left out", what, path, k)
			}
			if dataKeys[k] {
				continue
			}
			checkSchema(t, what, path+"."+k, e)
		}
	case []any:
		for i, e := range v {
			checkSchema(t, what, fmt.Sprintf("%s[%d]", path, i), e)
		}
	}
}

// Every client command's -o json on a quiet node (nothing pending, no
// candidate, nothing reclaimed): lower-camel keys, [] for an empty list,
// no Go field names beside their JSON twins.
func TestTheCLIsJSONIsOneSchema(t *testing.T) {
	s := newCLIScene(t)
	// Two passes remove the stale tap; the third is a quiet node's.
	for range 3 {
		if code, out, errOut := s.run(t, 0, nil, "pass"); code != 0 {
			t.Fatalf("pass: exit %d\n%s%s", code, out, errOut)
		}
	}
	ifindex := s.n.ifindex("G00000000a001H")
	for _, args := range [][]string{
		{"status"}, {"taps"}, {"taps", "G00000000a001H"}, {"pending"}, {"passes"}, {"passes", "--limit", "1"},
		{"pass", "--dry-run"}, {"maps"}, {"maps", "ifindex_vrf", "--ifindex", ifindex}, {"rows", ifindex},
	} {
		code, out, errOut := s.run(t, 0, nil, append(args, "-o", "json")...)
		if os.Getenv("GALACTICTEST_DUMP") != "" {
			t.Logf("%v:\n%s", args, out)
		}
		var v any
		if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil {
			t.Errorf("%v -o json: exit %d, %v\n%s%s", args, code, err, out, errOut)
			continue
		}
		checkSchema(t, strings.Join(args, " "), "", v)
	}
	// The runbooks' jq lines iterate lists a quiet node has empty.
	code, out, errOut := s.run(t, 0, nil, "passes", "-o", "json")
	var reps struct {
		Items []map[string]any `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &reps); code != 0 || err != nil || len(reps.Items) == 0 {
		t.Fatalf("passes -o json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	for _, k := range []string{"candidates", "confirmed", "reclaimed", "kept", "failed"} {
		if l, ok := reps.Items[0][k].([]any); !ok || len(l) != 0 {
			t.Errorf("a quiet pass's %s is %#v, want []", k, reps.Items[0][k])
		}
	}
	// Every jq line of docs/operations.md runs on this quiet node's real
	// output: the client as written, the socket from GALACTIC_SOCKET.
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	jqLines := 0
	for _, l := range strings.Split(string(doc), "\n") {
		if l = strings.TrimSpace(l); !strings.HasPrefix(l, "galactic-node ") || !strings.Contains(l, "| jq ") {
			continue
		}
		jqLines++
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", l)
		cmd.Env = append(cleanEnv(), "PATH="+filepath.Dir(s.bin)+":"+os.Getenv("PATH"), "GALACTIC_SOCKET="+s.n.socket)
		if out, err := cmd.CombinedOutput(); err != nil || strings.Contains(string(out), "error") {
			t.Errorf("docs/operations.md on a quiet node: %v\n$ %s\n%s", err, l, out)
		}
	}
	if jqLines < 4 {
		t.Errorf("docs/operations.md has %d jq lines; the JSON section alone has 4", jqLines)
	}
	// taps: the identity is vpc and attachment, once.
	_, out, _ = s.run(t, 0, nil, "taps", "-o", "json")
	if strings.Contains(out, `"VPC"`) || strings.Contains(out, `"Attachment"`) {
		t.Errorf("taps -o json shows Go's field names:\n%s", out)
	}
}

// Errors as kubectl says them: "error: …" on one line; a usage mistake
// exit 2 with the hint; NotFound exit 1 naming what there is; an empty
// list "No resources found" on stderr, exit 0; an unreachable daemon named
// with how to point at another.
func TestTheCLIsErrorsAndEmptyResultsAreKubectls(t *testing.T) {
	s := newCLIScene(t)
	for _, tc := range []struct {
		args []string
		code int
		want string // in stderr
	}{
		// A usage mistake: exit 2, one line and the hint.
		{[]string{"passes", "--limit", "33"}, 2, "error: --limit 33: want a number of reports from 1 to 32"},
		{[]string{"passes", "--limit", "0"}, 2, "error: --limit 0: want a number of reports from 1 to 32"},
		{[]string{"maps", "ifindex_vrf", "--limit", "0"}, 2, "error: --limit 0: want a number of rows"},
		{[]string{"taps", "--state", "gone"}, 2, `error: state "gone": want one of held, live`},
		{[]string{"taps", "a", "b"}, 2, `error: unexpected argument "b"`},
		// NotFound: exit 1, naming what there is.
		{[]string{"maps", "nosuch"}, 1, "the maps are "},
		{[]string{"rows", "99"}, 1, "error: interface 99 not found"},
		{[]string{"taps", "G00000000zzzzH"}, 1, `error: tap "G00000000zzzzH" not found`},
	} {
		code, out, errOut := s.run(t, 0, nil, tc.args...)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code != tc.code || out != "" || !strings.HasPrefix(errOut, "error: ") || !strings.Contains(errOut, tc.want) ||
			strings.Contains(errOut, "Bad Request") || strings.Contains(errOut, "Not Found") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d and %q", tc.args, code, out, errOut, tc.code, tc.want)
		}
		if hint := len(lines) == 2 && strings.HasPrefix(lines[1], "Run 'galactic-node "+tc.args[0]+" --help' for usage."); hint != (tc.code == 2) {
			t.Errorf("%v: stderr %q; the hint belongs to usage mistakes alone", tc.args, errOut)
		}
	}
	// A refusal says what needs more, not the authorization verb.
	if code, _, errOut := s.run(t, nobody, []uint32{readGroup}, "pass"); code != 3 || strings.Contains(errOut, "create") ||
		!strings.Contains(errOut, "error: ") || !strings.Contains(errOut, "forcing a pass needs root or an admin token") {
		t.Errorf("a reader forcing a pass: exit %d, %q", code, errOut)
	}
	// get-style: taps NAME is that tap; --state and --vpc filter.
	code, out, errOut := s.run(t, 0, nil, "taps", "G00000000a001H", "-o", "json")
	var tap map[string]any
	if err := json.Unmarshal([]byte(out), &tap); code != 0 || err != nil || tap["name"] != "G00000000a001H" {
		t.Errorf("taps NAME -o json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	if code, out, _ := s.run(t, 0, nil, "taps", "G00000000a001H"); code != 0 || strings.Count(out, "\n") != 2 {
		t.Errorf("taps NAME: exit %d, want a header and its row:\n%s", code, out)
	}
	if code, out, errOut := s.run(t, 0, nil, "taps", "--vpc", "a", "--state", "live"); code != 0 || !strings.Contains(out, "G00000000a001H") || strings.Contains(out, "G00000000a002H") {
		t.Errorf("taps --vpc a --state live: exit %d:\n%s%s", code, out, errOut)
	}
	// Empty: nothing on stdout, "No resources found" on stderr, exit 0 ...
	for _, args := range [][]string{{"taps", "--state", "confirmed"}, {"taps", "--vpc", "zz"}, {"pending"}} {
		if code, out, errOut := s.run(t, 0, nil, args...); code != 0 || out != "" || errOut != "No resources found\n" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 0 and No resources found", args, code, out, errOut)
		}
		// ... and for a script, an empty list.
		if code, out, errOut := s.run(t, 0, nil, append(args, "-o", "json")...); code != 0 || strings.Join(strings.Fields(out), "") != `{"items":[]}` || errOut != "" {
			t.Errorf("%v -o json: exit %d, stdout %q, stderr %q; want {\"items\": []}", args, code, out, errOut)
		}
	}
	// No daemon at the socket: said so, with how to point at another.
	code, _, errOut = s.run(t, 0, nil, "status", "--socket", "/nonexistent/admin.sock")
	if code != 1 || strings.Contains(errOut, "http://") || !strings.Contains(errOut, "error: the daemon is not reachable at /nonexistent/admin.sock") ||
		!strings.Contains(errOut, "--socket") || !strings.Contains(errOut, "GALACTIC_SOCKET") {
		t.Errorf("no daemon: exit %d, %q", code, errOut)
	}
}

// Each client command's --help is its own: its synopsis and its flags.
func TestEachClientCommandHasItsOwnHelp(t *testing.T) {
	own := map[string][]string{
		"status": nil, "pending": nil, "rows": nil,
		"taps":   {"-state", "-vpc"},
		"passes": {"-limit"},
		"pass":   {"-dry-run", "-allow-mass-removal"},
		"maps":   {"-ifindex", "-limit"},
		"drops":  {"-tap", "-limit", "-follow"},
	}
	all := []string{"-state", "-vpc", "-limit", "-dry-run", "-allow-mass-removal", "-ifindex", "-tap", "-follow"}
	for cmd, flags := range own {
		for _, args := range [][]string{{cmd, "--help"}, {cmd, "-h"}, {"help", cmd}} {
			r := runBin(t, binary, nil, args...)
			if r.code != 0 || r.stderr != "" || !strings.HasPrefix(r.stdout, "usage: galactic-node "+cmd+" ") ||
				!strings.Contains(r.stdout, "-socket") || !strings.Contains(r.stdout, "exit codes") {
				t.Errorf("%v: exit %d, stdout %.100q, stderr %q", args, r.code, r.stdout, r.stderr)
				continue
			}
			for _, f := range all {
				if has := strings.Contains(r.stdout, "  "+f+" ") || strings.Contains(r.stdout, "  "+f+"\n"); has != slices.Contains(flags, f) {
					t.Errorf("%v: lists %s: %t", args, f, has)
				}
			}
		}
	}
	// The daemon's help names each flag's type, not words of its usage.
	r := runBin(t, binary, nil, "run", "--help")
	if !strings.Contains(r.stdout, "-mass-removal-release-after duration") {
		t.Errorf("run --help: %q", r.stdout)
	}
}
