package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/datum-cloud/galactic-node/admin"
	"github.com/datum-cloud/galactic-node/internal/cli"
	"github.com/datum-cloud/galactic-node/internal/envflag"
	"github.com/datum-cloud/galactic-node/node/dropwatch"
)

// The client commands follow kubectl's conventions where it has them
// (errors as "error: …", NotFound exit 1, "No resources found" on stderr
// for an empty list, get-style NAME lookups, per-command help) and
// cilium-dbg's where it has none (commands talking to the local agent over
// its socket). They are built on internal/cli and the standard flag
// package, not spf13/cobra: the binary's other commands, galactic-hubctl
// and galactic-tap already hold the Conventions table (GALACTIC_<FLAG> for
// every flag, a usage mistake as one line and a hint, exit 2) through
// internal/cli and internal/envflag, which read flag.FlagSets; moving one
// binary's client alone to cobra/pflag would split those conventions in
// two, and moving all three is a larger change than per-command flag sets
// and help, which is what the client lacked. Should shell completion or
// "did you mean" for commands be wanted, that is the time to move all
// three binaries to cobra together.

// clientCommand is one client subcommand: what its help says and which
// admin route it reads.
type clientCommand struct {
	args    string // the synopsis after the command's name
	summary string
	path    string
	list    bool // its table is a list: empty, it says "No resources found"
}

// clientCommands are the subcommands that talk to a running daemon over
// its admin socket, as cilium-dbg does to cilium-agent.
var clientCommands = map[string]clientCommand{
	"status": {"", "Version, node, dry-run, readiness and why not, the last and next pass, the inventory, map fill. " +
		"Exit 4 when the daemon is not ready.", "/v1/status", false},
	"taps": {"[NAME]", "Every tenant tap and its state; with a NAME, that tap alone (NotFound, exit 1, when there is none). " +
		"--state and --vpc filter the list.", "/v1/taps", true},
	"pending": {"", "The candidates waiting for a confirming pass.", "/v1/taps/pending", true},
	"passes":  {"", "Recent pass reports, newest first.", "/v1/passes", true},
	"pass": {"", "Force a pass now (admin). --dry-run removes nothing; --allow-mass-removal releases the mass-removal brake. " +
		"Exit 4 when the pass did not complete or was braked.", "/v1/passes", false},
	"maps": {"[NAME]", "The eBPF maps; with a NAME, its rows (NotFound names the maps there are).", "/v1/ebpf/maps", true},
	"rows": {"IFINDEX", "The eBPF rows of one interface, and whether the program is attached to it " +
		"(NotFound, exit 1, for an interface the datapath does not know).", "/v1/ebpf/interfaces/", false},
	"drops": {"", "Sampled records of dropped frames, newest last. --follow keeps printing new ones until interrupted; " +
		"-o json prints one JSON record per line.", "/v1/drops", false},
}

// Exit codes of the client subcommands, for scripts.
const (
	exitOK         = 0 // done; for status, the daemon is ready
	exitFailed     = 1 // the daemon could not be reached, or failed the request; NotFound
	exitUsage      = 2 // bad command line
	exitRefused    = 3 // not authenticated or not allowed
	exitNotDone    = 4 // status: the daemon is not ready; pass: it did not complete
	exitRetryLater = 5 // rate-limited: forced passes per minute, or failed logins
)

// clientNotes close every client command's help.
const clientNotes = `The daemon is reached over its admin socket. As root on the node no token
is needed (the daemon reads the caller's uid from the socket); members of
the daemon's --admin-read-group may read, or do what a --token-file's token
allows. The socket admits no one else.

-o json is for scripts: keys are lower-camel, an empty list is [], and a
list command prints {"items": [...]} (docs/operations.md, "JSON for scripts").
An empty list's table prints "No resources found" on stderr, exit 0.

exit codes: 0 done (status: ready), 1 failed, unreachable or not found,
2 usage, 3 refused, 4 not ready / pass not completed or braked, 5 rate-limited`

// clientOpts are the client subcommands' flags.
type clientOpts struct {
	output            string
	socket, tokenFile *string
	timeout           *time.Duration
	dryRun, allowMass *bool
	ifindex           *uint
	limit             *int
	tap               *string
	follow            *bool
	state, vpc        *string
}

// clientFlagSet is the flag set of client subcommand cmd: the flags every
// command has, and its own. main.go lists every command's flags among the
// known GALACTIC_* variables.
func clientFlagSet(cmd string, o *clientOpts) *flag.FlagSet {
	fs := flag.NewFlagSet("galactic-node "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.output, "output", "table", "output form: table or json")
	fs.StringVar(&o.output, "o", "table", "short for --output")
	o.socket = fs.String("socket", "/run/galactic/admin.sock", "the daemon's admin socket")
	o.tokenFile = fs.String("token-file", "", "a file holding a bearer token, for callers other than root and the read group")
	timeoutHelp := "give up after this long (0: 30s)"
	if cmd == "pass" {
		timeoutHelp = "give up after this long (0: 2m, as a removing pass reads the API server and takes locks)"
	}
	o.timeout = fs.Duration("timeout", 0, timeoutHelp)
	o.dryRun, o.allowMass, o.ifindex, o.limit, o.tap, o.follow = new(bool), new(bool), new(uint), new(int), new(string), new(bool)
	o.state, o.vpc = new(string), new(string)
	switch cmd {
	case "taps":
		fs.StringVar(o.state, "state", "", "only the taps in this state: held, live, unstamped, candidate, confirmed or stale")
		fs.StringVar(o.vpc, "vpc", "", "only the taps of this VPC (base62, as the VPC column shows it)")
	case "pass":
		fs.BoolVar(o.dryRun, "dry-run", false, "compute and report, remove nothing")
		fs.BoolVar(o.allowMass, "allow-mass-removal", false, "release the mass-removal brake: this pass removes what it holds back (at the per-pass cap's pace)")
	case "maps":
		fs.UintVar(o.ifindex, "ifindex", 0, "with a map NAME: only the rows of this interface")
		fs.IntVar(o.limit, "limit", 0, fmt.Sprintf("with a map NAME: at most this many rows, from 1 to %d (default %d)", admin.MaxRows, admin.DefaultRows))
	case "drops":
		fs.StringVar(o.tap, "tap", "", "only the records of this tap")
		fs.IntVar(o.limit, "limit", 0, fmt.Sprintf("at most this many of the newest kept records (0: every one the daemon keeps, at most %d)", dropwatch.DefaultKeep))
		fs.BoolVar(o.follow, "follow", false, "keep printing new records until interrupted")
		fs.BoolVar(o.follow, "f", false, "short for --follow")
	case "passes":
		fs.IntVar(o.limit, "limit", 0, fmt.Sprintf("at most this many reports, newest first, from 1 to %d (default %d)", admin.MaxPasses, admin.DefaultPasses))
	}
	return fs
}

// printClientHelp writes cmd's own help: synopsis, what it does, its
// flags (the shared ones and its own), and what every client command
// shares.
func printClientHelp(w io.Writer, cmd string, fs *flag.FlagSet) {
	c := clientCommands[cmd]
	synopsis := "galactic-node " + cmd
	if c.args != "" {
		synopsis += " " + c.args
	}
	fmt.Fprintf(w, "usage: %s [flags]\n\n%s\n\nflags:\n", synopsis, c.summary)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	fmt.Fprintf(w, "\nEvery flag can also be set as %s<FLAG> (upper case, dashes as underscores).\n\n%s\n", envflag.Prefix, clientNotes)
}

// exitCode ends a command whose output already said why it exits non-zero
// (status: not ready; pass: braked), so nothing more is printed.
type exitCode int

func (c exitCode) Error() string { return fmt.Sprintf("exit status %d", int(c)) }

// runClient runs client subcommand cmd and returns the process's exit code.
func runClient(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) int {
	err := clientMain(ctx, cmd, args, stdout, stderr)
	if c := exitCode(0); errors.As(err, &c) {
		return int(c)
	}
	return cli.Exit(stderr, prog, err)
}

func clientMain(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) error {
	var o clientOpts
	fs := clientFlagSet(cmd, &o)
	socket, tokenFile, timeout, dryRun := o.socket, o.tokenFile, o.timeout, o.dryRun
	usageErr := func(format string, a ...any) error {
		return cli.Misuse("galactic-node "+cmd, fmt.Errorf(format, a...))
	}
	// Flags may follow the arguments (rows 7 -o json), as operators type.
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				printClientHelp(stdout, cmd, fs)
				return nil
			}
			return usageErr("%s", cliFlagMessage(err))
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if err := envflag.Unknown(os.Environ(), knownEnv()); err != nil {
		return usageErr("%v", err)
	}
	if err := envflag.Set(fs, os.LookupEnv); err != nil {
		return usageErr("%v", err)
	}
	output := o.output
	if output != "table" && output != "json" {
		return usageErr("--output %q: want table or json", output)
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true }) // the command line's and the environment's
	path, list := clientCommands[cmd].path, clientCommands[cmd].list
	switch {
	case cmd == "rows" && len(positional) != 1:
		return usageErr("rows takes one IFINDEX")
	case cmd == "rows":
		ifindex, err := strconv.ParseUint(positional[0], 10, 32)
		if err != nil || ifindex == 0 {
			return usageErr("IFINDEX %q: want an interface index above 0", positional[0])
		}
		path += strconv.FormatUint(ifindex, 10)
	case cmd == "maps" && len(positional) == 1:
		// One map's rows: the name is checked by the daemon (404 names them).
		path += "/" + url.PathEscape(positional[0])
		if given["limit"] && (*o.limit < 1 || *o.limit > admin.MaxRows) {
			return usageErr("--limit %d: want a number of rows from 1 to %d (default %d)", *o.limit, admin.MaxRows, admin.DefaultRows)
		}
	case cmd == "maps" && (given["ifindex"] || given["limit"]):
		return usageErr("--ifindex and --limit go with a map NAME")
	case cmd == "taps" && len(positional) == 1:
		if given["state"] || given["vpc"] {
			return usageErr("--state and --vpc filter the list; with a NAME, taps shows that tap")
		}
		path += "/" + url.PathEscape(positional[0])
		list = false // one tap, not a list: none is NotFound
	case cmd == "passes" && given["limit"] && (*o.limit < 1 || *o.limit > admin.MaxPasses):
		return usageErr("--limit %d: want a number of reports from 1 to %d (default %d)", *o.limit, admin.MaxPasses, admin.DefaultPasses)
	case cmd == "drops" && *o.limit < 0:
		return usageErr("--limit %d: want 0 (every kept record) or more", *o.limit)
	}
	if max := map[string]int{"maps": 1, "taps": 1}[cmd]; cmd != "rows" && len(positional) > max {
		return usageErr("unexpected argument %q", positional[max])
	}
	if *timeout <= 0 {
		*timeout = 30 * time.Second
		if cmd == "pass" {
			*timeout = 2 * time.Minute // a removing pass reads the API server and takes locks
		}
	}
	c := &client{socket: *socket, timeout: *timeout}
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("read the token: %w", err)
		}
		c.token = strings.TrimSpace(string(b))
	}

	method, query := http.MethodGet, url.Values{}
	if *o.ifindex != 0 {
		query.Set("ifindex", strconv.FormatUint(uint64(*o.ifindex), 10))
	}
	if *o.limit != 0 {
		query.Set("limit", strconv.Itoa(*o.limit))
	}
	if *o.tap != "" {
		query.Set("tap", *o.tap)
	}
	if *o.follow {
		query.Set("follow", "true")
	}
	if *o.state != "" {
		query.Set("state", *o.state)
	}
	if *o.vpc != "" {
		query.Set("vpc", *o.vpc)
	}
	if cmd == "drops" {
		return streamDrops(ctx, c, cmd, query, output == "json", stdout)
	}
	if cmd == "pass" {
		method = http.MethodPost
		if *dryRun {
			query.Set("dryRun", "true")
		}
		if *o.allowMass {
			query.Set("allowMassRemoval", "true")
		}
	}
	// status and pass decide their exit code from what they read, so they
	// always ask for JSON; the lists ask the daemon for its own table.
	wantJSON := output == "json" || cmd == "status" || cmd == "pass"
	code, body, err := c.do(ctx, method, path, query, wantJSON)
	if err := requestFailed(cmd, c.socket, code, body, err); err != nil {
		return err
	}
	switch cmd {
	case "status":
		return printStatus(stdout, body, output)
	case "pass":
		return printPass(stdout, body, output)
	}
	if output == "json" {
		return printJSON(stdout, body)
	}
	// A table with no row is its header alone (every cell is escaped onto
	// one line): kubectl says so on stderr and prints nothing to parse.
	if list && bytes.Count(bytes.TrimSpace(body), []byte("\n")) == 0 {
		fmt.Fprintln(stderr, "No resources found")
		return nil
	}
	_, _ = stdout.Write(body)
	return nil
}

// cliFlagMessage is the flag package's error in the form a user types the
// flags in, as internal/cli says them for every other command.
func cliFlagMessage(err error) string {
	msg := err.Error()
	for _, r := range [][2]string{
		{"flag provided but not defined: -", "unknown flag --"},
		{"flag needs an argument: -", "flag needs a value: --"},
		{" for flag -", " for flag --"},
	} {
		if strings.Contains(msg, r[0]) {
			return strings.Replace(msg, r[0], r[1], 1)
		}
	}
	return msg
}

// ErrUnreachable is a daemon that cannot be reached at its socket: none
// there, or nothing listening.
var ErrUnreachable = errors.New("the daemon is not reachable")

// requestFailed returns the error a request that did not get 200 means,
// with the exit code scripts branch on; nil for a 200.
func requestFailed(cmd, socket string, code int, body []byte, err error) error {
	switch {
	case errors.Is(err, syscall.EACCES):
		// The socket admits root and the daemon's read group only.
		return &cli.ExitError{Code: exitRefused, Err: fmt.Errorf("not allowed to connect to %s: run as root, or as a member of the daemon's --admin-read-group", socket)}
	case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ECONNREFUSED):
		why := "no socket there"
		if errors.Is(err, syscall.ECONNREFUSED) {
			why = "nothing listens on it"
		}
		return fmt.Errorf("%w at %s (%s): is galactic-node run running on this node? Point at another socket with --socket PATH or %sSOCKET",
			ErrUnreachable, socket, why, envflag.Prefix)
	case err != nil:
		return fmt.Errorf("%s: %w", cmd, err)
	case code == http.StatusOK:
		return nil
	}
	var e struct{ Error string }
	if json.Unmarshal(body, &e) != nil || e.Error == "" {
		e.Error = strings.TrimSpace(string(body))
	}
	// A table's error is the daemon's "error: …" line; say it once.
	msg := errors.New(strings.TrimPrefix(e.Error, "error: "))
	switch code {
	case http.StatusBadRequest:
		// The request is the command line's: a value the daemon refuses
		// is a usage mistake.
		return cli.Misuse("galactic-node "+cmd, msg)
	case http.StatusUnauthorized, http.StatusForbidden:
		return &cli.ExitError{Code: exitRefused, Err: msg}
	case http.StatusTooManyRequests:
		return &cli.ExitError{Code: exitRetryLater, Err: msg}
	}
	return msg
}

// streamDrops prints GET /v1/drops as it arrives, line by line: the
// daemon's text lines, or with jsonLines its NDJSON records as they are.
// --timeout bounds the wait for the answer to start, not a --follow.
func streamDrops(ctx context.Context, c *client, cmd string, query url.Values, jsonLines bool, stdout io.Writer) error {
	resp, cancel, err := c.open(ctx, http.MethodGet, "/v1/drops", query, jsonLines)
	if err != nil {
		return requestFailed(cmd, c.socket, 0, nil, err)
	}
	defer cancel()
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return requestFailed(cmd, c.socket, resp.StatusCode, body, nil)
	}
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 0, 4096), 64<<10)
	for lines.Scan() {
		if _, err := fmt.Fprintf(stdout, "%s\n", lines.Bytes()); err != nil {
			return exitCode(exitFailed) // stdout closed: | head
		}
	}
	if err := lines.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("drops: the stream broke: %w", err)
	}
	return nil
}

// client speaks HTTP to the admin socket.
type client struct {
	socket, token string
	timeout       time.Duration
}

// open sends a request and returns the answer as soon as its headers
// arrive, within the client's timeout; the body may then stream for as
// long as ctx lasts. cancel releases the request.
func (c *client) open(ctx context.Context, method, path string, query url.Values, wantJSON bool) (*http.Response, context.CancelFunc, error) {
	ctx, cancel := context.WithCancel(ctx)
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", c.socket)
		},
		ResponseHeaderTimeout: c.timeout,
	}}
	u := url.URL{Scheme: "http", Host: "node", Path: path, RawQuery: query.Encode()}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), nil)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	if wantJSON {
		req.Header.Set("Accept", "application/json")
	} else {
		req.Header.Set("Accept", "text/plain")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("%s %s on %s: %w", method, path, c.socket, err)
	}
	return resp, cancel, nil
}

func (c *client) do(ctx context.Context, method, path string, query url.Values, wantJSON bool) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, release, err := c.open(ctx, method, path, query, wantJSON)
	if err != nil {
		return 0, nil, err
	}
	defer release()
	defer resp.Body.Close()
	// The largest answer is a map dump of 10,000 rows.
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	return resp.StatusCode, body, nil
}

func printJSON(stdout io.Writer, body []byte) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, body, "", "  "); err != nil {
		return fmt.Errorf("the daemon's answer is not JSON: %w", err)
	}
	buf.WriteByte('\n')
	_, _ = buf.WriteTo(stdout)
	return nil
}

func printStatus(stdout io.Writer, body []byte, output string) error {
	var st admin.Status
	if err := json.Unmarshal(body, &st); err != nil {
		return fmt.Errorf("status: the daemon's answer does not parse: %w", err)
	}
	if output == "json" {
		if err := printJSON(stdout, body); err != nil {
			return err
		}
	} else {
		admin.WriteStatus(stdout, st, time.Now())
	}
	if !st.Ready {
		return exitCode(exitNotDone)
	}
	return nil
}

// passReport is what the pass subcommand reads of a report.
type passReport struct {
	Result       string   `json:"result"`
	Reason       string   `json:"reason"`
	DryRun       bool     `json:"dryRun"`
	Preview      bool     `json:"preview"`
	Candidates   []any    `json:"candidates"`
	Confirmed    []any    `json:"confirmed"`
	Held         []tapRef `json:"held"`
	WouldReclaim []tapRef `json:"wouldReclaim"`
	Reclaimed    []tapRef `json:"reclaimed"`
	Failed       []struct {
		Tap   tapRef `json:"tap"`
		Stage string `json:"stage"`
		Error string `json:"error"`
	} `json:"failed"`
	RolledOver int      `json:"rolledOver"`
	NotDone    []string `json:"notDone"`
	Brake      *struct {
		Engaged  bool   `json:"engaged"`
		Reason   string `json:"reason"`
		Held     int    `json:"held"`
		Released string `json:"released"`
	} `json:"brake"`
}

type tapRef struct {
	Name    string `json:"name"`
	Ifindex uint32 `json:"ifindex"`
}

func printPass(stdout io.Writer, body []byte, output string) error {
	var rep passReport
	if err := json.Unmarshal(body, &rep); err != nil {
		return fmt.Errorf("pass: the daemon's answer does not parse: %w", err)
	}
	if output == "json" {
		if err := printJSON(stdout, body); err != nil {
			return err
		}
	} else {
		reason := "-"
		if rep.Reason != "" {
			reason = strconv.Quote(rep.Reason) // the daemon's words, escaped
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "RESULT\tDRY RUN\tCANDIDATES\tCONFIRMED\tRECLAIMED\tWOULD RECLAIM\tFAILED\tROLLED OVER\tREASON")
		fmt.Fprintf(tw, "%s\t%t\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", rep.Result, rep.DryRun, len(rep.Candidates), len(rep.Confirmed),
			len(rep.Reclaimed), len(rep.WouldReclaim), len(rep.Failed), rep.RolledOver, reason)
		_ = tw.Flush()
		for _, t := range rep.Reclaimed {
			fmt.Fprintf(stdout, "reclaimed %s (ifindex %d)\n", t.Name, t.Ifindex)
		}
		for _, t := range rep.WouldReclaim {
			fmt.Fprintf(stdout, "would reclaim %s (ifindex %d)\n", t.Name, t.Ifindex)
		}
		for _, f := range rep.Failed {
			fmt.Fprintf(stdout, "failed %s (ifindex %d) at %s: %q\n", f.Tap.Name, f.Tap.Ifindex, f.Stage, f.Error)
		}
		// A preview's brake is what a real pass would meet: it neither
		// engaged nor released the brake, and must not read as if it had.
		released, engaged, held := "mass-removal brake released", "mass-removal brake engaged,", "held"
		if rep.Preview {
			released, engaged, held = "a real pass now would release the mass-removal brake", "a real pass now would meet the mass-removal brake,", "would hold"
		}
		if b := rep.Brake; b != nil && b.Released != "" {
			fmt.Fprintf(stdout, "%s %s\n", released, b.Released)
		}
		for _, t := range rep.Held {
			fmt.Fprintf(stdout, "%s %s (ifindex %d)\n", held, t.Name, t.Ifindex)
		}
		if b := rep.Brake; b != nil && b.Engaged {
			fmt.Fprintf(stdout, "%s %d confirmed taps held: %s\n", engaged, b.Held, b.Reason)
			fmt.Fprintln(stdout, "check that their objects are gone on purpose, then: galactic-node pass --allow-mass-removal")
		}
		for _, s := range rep.NotDone {
			fmt.Fprintf(stdout, "dry run, not done: %s\n", s) // the daemon's words
		}
	}
	// A braked pass removed nothing it meant to: scripts see it as not done.
	if rep.Result != "completed" || (rep.Brake != nil && rep.Brake.Engaged) {
		return exitCode(exitNotDone)
	}
	return nil
}
