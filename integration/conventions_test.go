package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// The conventions README.md's "Conventions" table promises for every binary,
// checked on the built binaries run as processes.

var (
	hubctlOnce   sync.Once
	hubctlBinary string
	hubctlErr    error
)

// hubctlBin builds galactic-hubctl once, beside TestMain's binaries (so
// TestMain removes it).
func hubctlBin(t *testing.T) string {
	t.Helper()
	hubctlOnce.Do(func() {
		// GALACTICTEST_HUBCTL_BIN runs the hub tests against another build
		// (an earlier commit's, to see a test fail there first).
		if bin := os.Getenv("GALACTICTEST_HUBCTL_BIN"); bin != "" {
			hubctlBinary = bin
			return
		}
		hubctlBinary = filepath.Join(filepath.Dir(binary), "galactic-hubctl")
		if out, err := goBuild("-o", hubctlBinary, "../cmd/galactic-hubctl").CombinedOutput(); err != nil {
			hubctlErr = errors.New("build hubctl: " + err.Error() + "\n" + string(out))
		}
	})
	if hubctlErr != nil {
		t.Fatal(hubctlErr)
	}
	return hubctlBinary
}

type result struct {
	code           int
	stdout, stderr string
}

// runBin runs bin with args and env added to a GALACTIC_*-free copy of
// this process's environment.
func runBin(t *testing.T, bin string, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(cleanEnv(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("%s %v: %v", bin, args, err)
	}
	return result{cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()}
}

func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GALACTIC_") && !strings.HasPrefix(kv, "CNI_") {
			env = append(env, kv)
		}
	}
	return env
}

func binaries(t *testing.T) map[string]string {
	return map[string]string{"galactic-node": binary, "galactic-hubctl": hubctlBin(t), "galactic-tap": tapPlugin}
}

func TestConventionVersionBothWays(t *testing.T) {
	for name, bin := range binaries(t) {
		a, b := runBin(t, bin, nil, "version"), runBin(t, bin, nil, "--version")
		for _, r := range []result{a, b} {
			if r.code != 0 || r.stderr != "" || strings.Count(r.stdout, "\n") != 1 || len(r.stdout) < 2 {
				t.Errorf("%s: exit %d, stdout %q, stderr %q; want 0 and one line of version", name, r.code, r.stdout, r.stderr)
			}
		}
		if a.stdout != b.stdout {
			t.Errorf("%s: version %q, --version %q", name, a.stdout, b.stdout)
		}
	}
	// The CNI protocol stays skel's: VERSION answers JSON, no command the about text.
	r := runBin(t, tapPlugin, []string{"CNI_COMMAND=VERSION"})
	var v struct{ SupportedVersions []string }
	if err := json.Unmarshal([]byte(r.stdout), &v); r.code != 0 || err != nil || len(v.SupportedVersions) == 0 {
		t.Errorf("CNI_COMMAND=VERSION: exit %d, %q, %v", r.code, r.stdout, err)
	}
	if r := runBin(t, tapPlugin, nil); r.code != 0 || !strings.Contains(r.stderr, "CNI protocol versions supported") {
		t.Errorf("no CNI_COMMAND: exit %d, stderr %q", r.code, r.stderr)
	}
}

// Without linker flags the version is the module's, from Go's build
// information; with them, theirs.
func TestConventionVersionComesFromTheBuild(t *testing.T) {
	dir := t.TempDir()
	for name, pkg := range map[string]string{"galactic-node": "main.version", "galactic-hubctl": "main.version", "galactic-tap": "main.buildVersion"} {
		vcs, flagged := filepath.Join(dir, name+"-vcs"), filepath.Join(dir, name+"-ldflags")
		for _, args := range [][]string{
			{"-buildvcs=true", "-o", vcs, "../cmd/" + name},
			{"-ldflags", "-X " + pkg + "=v9.8.7-test", "-o", flagged, "../cmd/" + name},
		} {
			if out, err := goBuild(args...).CombinedOutput(); err != nil {
				t.Fatalf("go build %v: %v\n%s", args, err, out)
			}
		}
		if r := runBin(t, flagged, nil, "--version"); r.stdout != "v9.8.7-test\n" {
			t.Errorf("%s built with -X: version %q", name, r.stdout)
		}
		// A pseudo-version or the revision, marked dirty or not: never "dev".
		if r := runBin(t, vcs, nil, "version"); !regexp.MustCompile(`^(v\d+\.\d+\.\d+\S*|[0-9a-f]{40}(-dirty)?)\n$`).MatchString(r.stdout) {
			t.Errorf("%s built with VCS information and no -X: version %q, want the module's", name, r.stdout)
		}
	}
}

func TestConventionUsageErrorIsOneLineAndAHintExitTwo(t *testing.T) {
	for _, tc := range []struct {
		bin  string
		args []string
		want string // the first line
		help string
	}{
		{binary, []string{"run", "--intervall", "1m"}, "error: unknown flag --intervall", "galactic-node run --help"},
		{binary, []string{"run", "--interval", "soon"}, `error: invalid value "soon" for flag --interval`, "galactic-node run --help"},
		{binary, []string{"install-cni", "--bogus"}, "error: unknown flag --bogus", "galactic-node install-cni --help"},
		{binary, []string{"tap", "add", "--bogus"}, "error: unknown flag --bogus", "galactic-node tap add --help"},
		{binary, []string{"tap", "rename"}, `error: tap "rename": want add, del or hold`, "galactic-node tap --help"},
		{binary, []string{"frobnicate"}, `error: unknown command "frobnicate"`, "galactic-node --help"},
		{binary, nil, "error: no command given", "galactic-node --help"},
		{hubctlBin(t), []string{"--workerz", "3"}, "error: unknown flag --workerz", "galactic-hubctl --help"},
		{hubctlBin(t), []string{"stray"}, `error: unexpected argument "stray"`, "galactic-hubctl --help"},
		{tapPlugin, []string{"--bogus"}, `error: unknown argument "--bogus"`, "galactic-tap --help"},
	} {
		r := runBin(t, tc.bin, nil, tc.args...)
		want := tc.want + "\nRun '" + tc.help + "' for usage.\n"
		if r.code != 2 || !strings.HasPrefix(r.stderr, tc.want) || !strings.HasSuffix(r.stderr, "Run '"+tc.help+"' for usage.\n") ||
			strings.Count(r.stderr, "\n") != 2 || r.stdout != "" {
			t.Errorf("%s %v: exit %d, stderr %q, stdout %q; want 2 and %q", filepath.Base(tc.bin), tc.args, r.code, r.stderr, r.stdout, want)
		}
	}
}

func TestConventionHelpGoesToStdoutExitZero(t *testing.T) {
	for _, tc := range []struct {
		bin  string
		args []string
		want string
	}{
		{binary, []string{"-h"}, "usage: galactic-node <command>"},
		{binary, []string{"--help"}, "usage: galactic-node <command>"},
		{binary, []string{"help"}, "usage: galactic-node <command>"},
		{binary, []string{"help", "run"}, "usage: galactic-node run"},
		{binary, []string{"run", "-h"}, "usage: galactic-node run"},
		{binary, []string{"run", "--help"}, "usage: galactic-node run"},
		{binary, []string{"install-cni", "-h"}, "usage: galactic-node install-cni"},
		{binary, []string{"tap", "--help"}, "usage: galactic-node tap"},
		{binary, []string{"tap", "add", "-h"}, "usage: galactic-node tap"},
		{hubctlBin(t), []string{"-h"}, "usage: galactic-hubctl"},
		{hubctlBin(t), []string{"--help"}, "usage: galactic-hubctl"},
		{hubctlBin(t), []string{"help"}, "usage: galactic-hubctl"},
		{tapPlugin, []string{"-h"}, "usage: galactic-tap"},
		{tapPlugin, []string{"--help"}, "usage: galactic-tap"},
		{tapPlugin, []string{"help"}, "usage: galactic-tap"},
	} {
		r := runBin(t, tc.bin, nil, tc.args...)
		if r.code != 0 || !strings.HasPrefix(r.stdout, tc.want) || r.stderr != "" {
			t.Errorf("%s %v: exit %d, stdout %.80q, stderr %q; want 0 and %q on stdout", filepath.Base(tc.bin), tc.args, r.code, r.stdout, r.stderr, tc.want)
		}
	}
}

func TestConventionEnvironment(t *testing.T) {
	hubctl := hubctlBin(t)
	for _, tc := range []struct {
		bin  string
		env  []string
		args []string
		code int
		want string
	}{
		// An unknown GALACTIC_* is a usage mistake, named with the flag it likely meant.
		{binary, []string{"GALACTIC_INTERVALL=1m"}, []string{"run"}, 2, "unknown environment variable GALACTIC_INTERVALL (did you mean GALACTIC_INTERVAL?)"},
		{binary, []string{"GALACTIC_NO_SUCH_THING=1"}, []string{"install-cni"}, 2, "unknown environment variable GALACTIC_NO_SUCH_THING"},
		{binary, []string{"GALACTIC_NO_SUCH_THING=1"}, []string{"tap", "add"}, 2, "unknown environment variable GALACTIC_NO_SUCH_THING"},
		{hubctl, []string{"GALACTIC_KUBE_API_QSP=9"}, nil, 2, "unknown environment variable GALACTIC_KUBE_API_QSP (did you mean GALACTIC_KUBE_API_QPS?)"},
		// A real flag's variable takes effect, a sibling command's is no mistake.
		{binary, []string{"GALACTIC_LOG_FORMAT=bogus", "GALACTIC_CNI_BIN_DIR=/x", "GALACTIC_SOCKET=/x"}, []string{"run", "--admin-socket="}, 2, `--log-format "bogus": want json or text`},
		{binary, []string{"GALACTIC_LOG_FORMAT=bogus", "GALACTIC_INTERVAL=1m"}, []string{"install-cni"}, 2, `--log-format "bogus": want json or text`},
		{binary, []string{"GALACTIC_VPC=not base62!", "GALACTIC_ATTACHMENT=1"}, []string{"tap", "hold"}, 2, "--vpc/--attachment"},
		{hubctl, []string{"GALACTIC_LOG_FORMAT=bogus", "GALACTIC_PLATFORM_NAMESPACE=p"}, nil, 2, `--log-format "bogus": want json or text`},
		// The kubelet's service links for the project's own Services are no
		// mistake: the next error is the bad log format, not them.
		{binary, append(serviceLinks(), "GALACTIC_LOG_FORMAT=bogus"), []string{"install-cni"}, 2, `--log-format "bogus": want json or text`},
		{binary, append(serviceLinks(), "GALACTIC_LOG_FORMAT=bogus"), []string{"run"}, 2, `--log-format "bogus": want json or text`},
		{hubctl, append(serviceLinks(), "GALACTIC_LOG_FORMAT=bogus", "GALACTIC_PLATFORM_NAMESPACE=p"), nil, 2, `--log-format "bogus": want json or text`},
	} {
		r := runBin(t, tc.bin, tc.env, tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) || strings.Count(r.stderr, "\n") != 2 {
			t.Errorf("%s %v %v: exit %d, stderr %q; want %d and %q", filepath.Base(tc.bin), tc.env, tc.args, r.code, r.stderr, tc.code, tc.want)
		}
	}
	// The CNI plugin runs in the runtime's environment: it ignores GALACTIC_*.
	env := []string{"GALACTIC_NO_SUCH_THING=1", "GALACTIC_LOG_FORMAT=bogus"}
	if r := runBin(t, tapPlugin, append(env, "CNI_COMMAND=VERSION")); r.code != 0 || !strings.Contains(r.stdout, "supportedVersions") {
		t.Errorf("galactic-tap with GALACTIC_* set, CNI_COMMAND=VERSION: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if r := runBin(t, tapPlugin, env, "--version"); r.code != 0 {
		t.Errorf("galactic-tap --version with GALACTIC_* set: exit %d, %q", r.code, r.stderr)
	}
}

// serviceLinks are the variables a kubelet gives every container of a pod
// in galactic-system for the project's two metrics Services, unless the pod
// sets enableServiceLinks: false.
func serviceLinks() []string {
	var env []string
	for _, svc := range []struct {
		prefix, ip, port string
	}{{"GALACTIC_NODE_METRICS", "10.96.0.80", "9180"}, {"GALACTIC_HUBCTL_METRICS", "10.96.12.34", "9181"}} {
		p, url := svc.prefix+"_PORT_"+svc.port+"_TCP", "tcp://"+svc.ip+":"+svc.port
		env = append(env, svc.prefix+"_SERVICE_HOST="+svc.ip, svc.prefix+"_SERVICE_PORT="+svc.port,
			svc.prefix+"_SERVICE_PORT_METRICS="+svc.port, svc.prefix+"_PORT="+url, p+"="+url,
			p+"_PROTO=tcp", p+"_PORT="+svc.port, p+"_ADDR="+svc.ip)
	}
	return env
}

// jsonLines fails t unless every line of log is a JSON object, and returns them.
func jsonLines(t *testing.T, what, log string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Errorf("%s: a log line is not JSON: %q", what, sc.Text())
			continue
		}
		lines = append(lines, m)
	}
	return lines
}

func buildInfoLine(t *testing.T, what, metrics string) {
	t.Helper()
	if !regexp.MustCompile(`(?m)^galactic_build_info\{goversion="go[^"]+",revision="[^"]+",version="[^"]+"\} 1$`).MatchString(metrics) {
		t.Errorf("%s: no galactic_build_info 1 with version, revision and goversion in /metrics", what)
	}
}

// The hub controller against an API server that never answers: client-go
// logs (informers, leader election), which must come out as JSON lines
// like the controller's own; it serves /metrics meanwhile.
func TestConventionHubctlLogsJSONDurationsAsTextAndBuildInfo(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(hubctlBin(t), "--kubeconfig", kubeconfig, "--platform-namespace", "p", "--listen", "127.0.0.1:0",
		"--log-format", "json", "--leader-elect-lease-duration=3s", "--leader-elect-renew-deadline=2s", "--leader-elect-retry-period=100ms")
	cmd.Env = cleanEnv()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var log strings.Builder
	addr := make(chan string, 1)
	clientGo := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		seen := false
		for sc.Scan() {
			line := sc.Text()
			log.WriteString(line + "\n")
			var m map[string]any
			_ = json.Unmarshal([]byte(line), &m)
			if a, ok := m["address"].(string); ok && m["msg"] == "serving metrics and health" {
				addr <- a
			}
			// Lines that are not the controller's own: client-go's, through klog.
			if msg, _ := m["msg"].(string); !seen && msg != "" && !strings.HasPrefix(msg, "galactic-hubctl") && msg != "serving metrics and health" {
				seen = true
				close(clientGo)
			}
		}
	}()
	var a string
	select {
	case a = <-addr:
	case <-time.After(30 * time.Second):
		t.Fatal("hubctl never served its metrics")
	}
	resp, err := http.Get("http://" + a + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	buildInfoLine(t, "galactic-hubctl", string(body))
	select {
	case <-clientGo:
	case <-time.After(30 * time.Second):
		t.Error("client-go logged nothing against an unreachable API server")
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()
	started := false
	for _, m := range jsonLines(t, "galactic-hubctl", log.String()) {
		if m["msg"] == "galactic-hubctl starting" {
			started = true
			if m["lease_duration"] != "3s" || m["retry_period"] != "100ms" {
				t.Errorf("durations in the startup line: %v %v, want \"3s\" \"100ms\"", m["lease_duration"], m["retry_period"])
			}
		}
	}
	if !started {
		t.Errorf("no startup line:\n%s", log.String())
	}
}

// The node daemon with --log-format json logs JSON (client-go's lines
// too), durations as text, and serves galactic_build_info.
func TestConventionNodeLogsJSONDurationsAsTextAndBuildInfo(t *testing.T) {
	nettest.RequirePrivileged(t)
	n := newNode(t)
	d, log := n.start("--inventory-file", n.writeInventory(), "--log-format", "json", "--interval", "1m")
	n.waitReady(log)
	out := n.metrics()
	buildInfoLine(t, "galactic-node", out)
	_ = d.Process.Signal(syscall.SIGTERM)
	_ = d.Wait()
	started := false
	for _, m := range jsonLines(t, "galactic-node", log.String()) {
		if m["msg"] == "galactic-node starting" {
			started = true
			if m["interval"] != "1m0s" || m["min_candidate_age"] != "0s" {
				t.Errorf("durations in the startup line: interval %v, min_candidate_age %v; want \"1m0s\" and \"0s\"", m["interval"], m["min_candidate_age"])
			}
		}
	}
	if !started {
		t.Errorf("no startup line:\n%s", log)
	}

	// Against an API server that never answers, client-go's informers log:
	// through the daemon's logger, as JSON.
	kubeconfig := filepath.Join(n.dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	d, log = n.start("--kubeconfig", kubeconfig, "--log-format", "json", "--metrics-listen", "")
	time.Sleep(3 * time.Second)
	_ = d.Process.Signal(syscall.SIGTERM)
	_ = d.Wait()
	lines := jsonLines(t, "galactic-node against an unreachable API server", log.String())
	own := regexp.MustCompile(`^(galactic-node starting|admin API listening|stopping|stopped|forced passes|single-queue)`)
	clientGo := 0
	for _, m := range lines {
		if msg, _ := m["msg"].(string); !own.MatchString(msg) {
			clientGo++
		}
	}
	if clientGo == 0 {
		t.Errorf("nothing but the daemon's own lines against an unreachable API server:\n%s", log)
	}
}

// The Conventions rows on per-command help, NotFound, empty results and
// the JSON schema, on each binary they apply to; integration/cli_scripts_test.go
// checks every client command in depth.
func TestConventionPerCommandHelpNotFoundEmptyAndJSON(t *testing.T) {
	// Per-command help: each command's own flags, and not another's.
	for _, tc := range []struct {
		args       []string
		has, lacks []string
	}{
		{[]string{"run", "--help"}, []string{"-interval ", "-mass-removal-release-after duration"}, []string{"-socket", "-cni-bin-dir"}},
		{[]string{"install-cni", "--help"}, []string{"-cni-bin-dir"}, []string{"-socket", "-interval "}},
		{[]string{"tap", "--help"}, []string{"-attachment"}, []string{"-socket", "-interval "}},
		{[]string{"taps", "--help"}, []string{"-socket", "-state", "-vpc"}, []string{"-limit", "-dry-run", "-interval "}},
		{[]string{"passes", "--help"}, []string{"-socket", "-limit"}, []string{"-state", "-dry-run"}},
		{[]string{"pass", "--help"}, []string{"-dry-run", "-allow-mass-removal"}, []string{"-limit", "-state"}},
		{[]string{"help", "maps"}, []string{"-ifindex", "-limit"}, []string{"-dry-run"}},
	} {
		r := runBin(t, binary, nil, tc.args...)
		if r.code != 0 || r.stderr != "" {
			t.Errorf("galactic-node %v: exit %d, stderr %q", tc.args, r.code, r.stderr)
		}
		for _, f := range tc.has {
			if !strings.Contains(r.stdout, "  "+f) {
				t.Errorf("galactic-node %v lists no %s", tc.args, f)
			}
		}
		for _, f := range tc.lacks {
			if strings.Contains(r.stdout, "  "+f) {
				t.Errorf("galactic-node %v lists %s, another command's flag", tc.args, f)
			}
		}
	}
	// hubctl has one command and no -o; the tap plugin has no flags.
	if r := runBin(t, hubctlBin(t), nil, "-o", "json"); r.code != 2 || !strings.HasPrefix(r.stderr, "error: unknown flag") {
		t.Errorf("galactic-hubctl -o json: exit %d, %q; the JSON row does not apply, so -o is an unknown flag", r.code, r.stderr)
	}
	if r := runBin(t, tapPlugin, nil, "-o", "json"); r.code != 2 || !strings.HasPrefix(r.stderr, "error: ") {
		t.Errorf("galactic-tap -o json: exit %d, %q; it takes no flags", r.code, r.stderr)
	}

	// NotFound, empty results and the JSON schema on a running daemon.
	s := newCLIScene(t)
	if code, out, errOut := s.run(t, 0, nil, "taps", "G00000000zzzzH"); code != 1 || out != "" || errOut != "error: tap \"G00000000zzzzH\" not found\n" {
		t.Errorf("taps NOSUCH: exit %d, %q %q; want 1 and NotFound", code, out, errOut)
	}
	if code, out, errOut := s.run(t, 0, nil, "pending"); code != 0 || out != "" || errOut != "No resources found\n" {
		t.Errorf("pending, none: exit %d, %q %q; want 0 and No resources found", code, out, errOut)
	}
	code, out, _ := s.run(t, 0, nil, "passes", "-o", "json")
	var v any
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || strings.Join(strings.Fields(out), "") != `{"items":[]}` {
		t.Errorf("passes -o json, none yet: exit %d, %v, %q; want {\"items\": []}", code, err, out)
	}
	code, out, _ = s.run(t, 0, nil, "taps", "-o", "json")
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil {
		t.Fatalf("taps -o json: exit %d, %v", code, err)
	}
	checkSchema(t, "taps -o json", "", v)
}
