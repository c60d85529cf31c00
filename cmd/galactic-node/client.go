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
	"github.com/datum-cloud/galactic-node/internal/envflag"
	"github.com/datum-cloud/galactic-node/node/dropwatch"
)

// clientCommands are the subcommands that talk to a running daemon over
// its admin socket, as cilium-dbg does to cilium-agent.
var clientCommands = map[string]bool{"status": true, "taps": true, "pending": true, "passes": true, "pass": true, "maps": true, "rows": true, "drops": true}

// Exit codes of the client subcommands, for scripts.
const (
	exitOK         = 0 // done; for status, the daemon is ready
	exitFailed     = 1 // the daemon could not be reached, or failed the request
	exitUsage      = 2 // bad command line
	exitRefused    = 3 // not authenticated or not allowed
	exitNotDone    = 4 // status: the daemon is not ready; pass: it did not complete
	exitRetryLater = 5 // rate-limited: forced passes per minute, or failed logins
)

const clientUsage = `usage: galactic-node COMMAND [flags]

Talk to the node daemon over its admin socket. As root on the node no token
is needed (the daemon reads the caller's uid from the socket); members of
the daemon's --admin-read-group may read, or do what a --token-file's token
allows. The socket admits no one else.

commands:
  status          version, node, dry-run, readiness, the last and next pass, the inventory, map fill
  taps            every tenant tap and its state
  pending         candidates waiting for a confirming pass
  passes          recent pass reports, newest first (--limit N, default 8, at most 32)
  pass            force a pass now (admin); --dry-run removes nothing;
                  --allow-mass-removal releases the mass-removal brake
  maps [NAME]     the eBPF maps; with a NAME, its rows (--ifindex N, --limit N)
  rows IFINDEX    the eBPF rows of one interface
  drops           sampled records of dropped frames, newest last (--tap NAME, --limit N);
                  --follow (-f) keeps printing new ones until interrupted; -o json
                  prints one JSON record per line

flags:
  -o, --output table|json   output form (default table)
  --socket PATH             admin socket (default /run/galactic/admin.sock)
  --token-file PATH         a file holding a bearer token, for callers other than root
  --timeout DURATION        give up after this long (default 30s; pass: 2m)

exit codes: 0 done (status: ready), 1 failed or unreachable, 2 usage,
3 refused, 4 not ready / pass not completed or braked, 5 rate-limited`

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
}

// clientFlagSet is the flag set of client subcommand cmd; main.go lists
// its flags among the known GALACTIC_* variables.
func clientFlagSet(cmd string, o *clientOpts) *flag.FlagSet {
	fs := flag.NewFlagSet("galactic-node "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.output, "output", "table", "table or json")
	fs.StringVar(&o.output, "o", "table", "table or json")
	o.socket = fs.String("socket", "/run/galactic/admin.sock", "admin socket")
	o.tokenFile = fs.String("token-file", "", "a file holding a bearer token")
	o.timeout = fs.Duration("timeout", 0, "give up after this long")
	o.dryRun, o.allowMass, o.ifindex, o.limit, o.tap, o.follow = new(bool), new(bool), new(uint), new(int), new(string), new(bool)
	switch cmd {
	case "pass":
		fs.BoolVar(o.dryRun, "dry-run", false, "compute and report, remove nothing")
		fs.BoolVar(o.allowMass, "allow-mass-removal", false, "release the mass-removal brake: this pass removes what it holds back (at the per-pass cap's pace)")
	case "maps":
		fs.UintVar(o.ifindex, "ifindex", 0, "with a map NAME: only the rows of this interface")
		fs.IntVar(o.limit, "limit", 0, "with a map NAME: at most this many rows (the daemon's default 100, at most 10000)")
	case "drops":
		fs.StringVar(o.tap, "tap", "", "only the records of this tap")
		fs.IntVar(o.limit, "limit", 0, fmt.Sprintf("at most this many of the newest kept records (0: every one the daemon keeps, at most %d)", dropwatch.DefaultKeep))
		fs.BoolVar(o.follow, "follow", false, "keep printing new records until interrupted")
		fs.BoolVar(o.follow, "f", false, "keep printing new records until interrupted")
	case "passes":
		fs.IntVar(o.limit, "limit", 0, fmt.Sprintf("at most this many reports, newest first (the daemon's default %d, at most %d)", admin.DefaultPasses, admin.MaxPasses))
	}
	return fs
}

// runClient runs client subcommand cmd and returns the process's exit code.
func runClient(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) int {
	var o clientOpts
	fs := clientFlagSet(cmd, &o)
	socket, tokenFile, timeout, dryRun := o.socket, o.tokenFile, o.timeout, o.dryRun
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "galactic-node %s: %s\nRun 'galactic-node %s --help' for usage.\n", cmd, fmt.Sprintf(format, a...), cmd)
		return exitUsage
	}
	// Flags may follow the arguments (rows 7 -o json), as operators type.
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprintln(stdout, clientUsage)
				return exitOK
			}
			return usageErr("%v", err)
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
		return usageErr("-o %q: want table or json", output)
	}
	path := map[string]string{"status": "/v1/status", "taps": "/v1/taps", "pending": "/v1/taps/pending",
		"passes": "/v1/passes", "pass": "/v1/passes", "maps": "/v1/ebpf/maps", "drops": "/v1/drops"}[cmd]
	switch {
	case cmd == "rows" && len(positional) != 1:
		return usageErr("rows takes one IFINDEX")
	case cmd == "rows":
		ifindex, err := strconv.ParseUint(positional[0], 10, 32)
		if err != nil || ifindex == 0 {
			return usageErr("IFINDEX %q: want an interface index above 0", positional[0])
		}
		path = "/v1/ebpf/interfaces/" + strconv.FormatUint(ifindex, 10)
	case cmd == "maps" && len(positional) == 1:
		// One map's rows: the name is checked by the daemon (404 names it).
		path = "/v1/ebpf/maps/" + url.PathEscape(positional[0])
	case cmd == "maps" && (*o.ifindex != 0 || *o.limit != 0):
		return usageErr("--ifindex and --limit go with a map NAME")
	case len(positional) > 0 && (cmd != "maps" || len(positional) != 1):
		return usageErr("unexpected argument %q", positional[len(positional)-1])
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
			fmt.Fprintf(stderr, "galactic-node %s: token: %v\n", cmd, err)
			return exitFailed
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
	if cmd == "drops" {
		return streamDrops(ctx, c, cmd, query, output == "json", stdout, stderr)
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
	if exit, failed := requestFailed(cmd, c.socket, code, body, err, stderr); failed {
		return exit
	}
	switch cmd {
	case "status":
		return printStatus(stdout, stderr, body, output)
	case "pass":
		return printPass(stdout, stderr, body, output)
	}
	if output == "json" {
		return printJSON(stdout, stderr, body)
	}
	_, _ = stdout.Write(body)
	return exitOK
}

// requestFailed reports a request that did not get 200 on stderr, and the
// exit code it means; failed is false for a 200.
func requestFailed(cmd, socket string, code int, body []byte, err error, stderr io.Writer) (exit int, failed bool) {
	if errors.Is(err, syscall.EACCES) {
		// The socket admits root and the daemon's read group only.
		fmt.Fprintf(stderr, "galactic-node %s: not allowed to connect to %s: run as root, or as a member of the daemon's --admin-read-group\n", cmd, socket)
		return exitRefused, true
	}
	if err != nil {
		fmt.Fprintf(stderr, "galactic-node %s: %v\n", cmd, err)
		return exitFailed, true
	}
	if code == http.StatusOK {
		return exitOK, false
	}
	var e struct{ Error string }
	if json.Unmarshal(body, &e) != nil || e.Error == "" {
		e.Error = strings.TrimSpace(string(body))
	}
	fmt.Fprintf(stderr, "galactic-node %s: %s: %s\n", cmd, http.StatusText(code), e.Error)
	switch code {
	case http.StatusUnauthorized, http.StatusForbidden:
		return exitRefused, true
	case http.StatusTooManyRequests:
		return exitRetryLater, true
	}
	return exitFailed, true
}

// streamDrops prints GET /v1/drops as it arrives, line by line: the
// daemon's text lines, or with jsonLines its NDJSON records as they are.
// --timeout bounds the wait for the answer to start, not a --follow.
func streamDrops(ctx context.Context, c *client, cmd string, query url.Values, jsonLines bool, stdout, stderr io.Writer) int {
	resp, cancel, err := c.open(ctx, http.MethodGet, "/v1/drops", query, jsonLines)
	if err != nil {
		code, _ := requestFailed(cmd, c.socket, 0, nil, err, stderr)
		return code
	}
	defer cancel()
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		code, _ := requestFailed(cmd, c.socket, resp.StatusCode, body, nil, stderr)
		return code
	}
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 0, 4096), 64<<10)
	for lines.Scan() {
		if _, err := fmt.Fprintf(stdout, "%s\n", lines.Bytes()); err != nil {
			return exitFailed // stdout closed: | head
		}
	}
	if err := lines.Err(); err != nil && ctx.Err() == nil {
		fmt.Fprintf(stderr, "galactic-node %s: the stream broke: %v\n", cmd, err)
		return exitFailed
	}
	return exitOK
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

func printJSON(stdout, stderr io.Writer, body []byte) int {
	var buf bytes.Buffer
	if err := json.Indent(&buf, body, "", "  "); err != nil {
		fmt.Fprintf(stderr, "galactic-node: the daemon's answer is not JSON: %v\n", err)
		return exitFailed
	}
	buf.WriteByte('\n')
	_, _ = buf.WriteTo(stdout)
	return exitOK
}

func printStatus(stdout, stderr io.Writer, body []byte, output string) int {
	var st admin.Status
	if err := json.Unmarshal(body, &st); err != nil {
		fmt.Fprintf(stderr, "galactic-node status: the daemon's answer does not parse: %v\n", err)
		return exitFailed
	}
	if output == "json" {
		if code := printJSON(stdout, stderr, body); code != exitOK {
			return code
		}
	} else {
		admin.WriteStatus(stdout, st, time.Now())
	}
	if !st.Ready {
		return exitNotDone
	}
	return exitOK
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

func printPass(stdout, stderr io.Writer, body []byte, output string) int {
	var rep passReport
	if err := json.Unmarshal(body, &rep); err != nil {
		fmt.Fprintf(stderr, "galactic-node pass: the daemon's answer does not parse: %v\n", err)
		return exitFailed
	}
	if output == "json" {
		if code := printJSON(stdout, stderr, body); code != exitOK {
			return code
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
		return exitNotDone
	}
	return exitOK
}
