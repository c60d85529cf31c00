package integration

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// phaseSyscalls are the system calls whose times mark a verb's phases.
// perf trace reads them from the kernel's syscall tracepoints: the plugin
// is never stopped, as strace's ptrace would stop it at each, so the
// phases keep their proportions.
const phaseSyscalls = "read,statfs,socket,flock,bpf,sendmsg,rename,renameat,renameat2,unlinkat,exit_group"

// traced is one system call of a verb as perf trace printed it.
type traced struct {
	at, took float64 // ms since the trace began, and its duration
	name     string
	args     string
}

// tracedLine is one line of perf trace: "12.371 ( 0.011 ms): comm/pid
// call(args) = ret"; a call that does not return (exit_group) has no
// duration.
var tracedLine = regexp.MustCompile(`^\s*([0-9.]+) \(\s*(?:([0-9.]+) ms)?\s*\): \S+ (\w+)\((.*)\)\s+=`)

// readTrace parses one verb's perf trace output.
func readTrace(path string) ([]traced, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []traced
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := tracedLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		at, _ := strconv.ParseFloat(m[1], 64)
		took, _ := strconv.ParseFloat(m[2], 64)
		out = append(out, traced{at: at, took: took, name: m[3], args: m[4]})
	}
	return out, sc.Err()
}

// phase is a named share of one verb, in ms.
type phase struct {
	name string
	ms   float64
}

// verbPhases cuts one traced verb into phases at its marks: the request
// read from stdin (fd 0, which perf trace leaves unnamed), the bpffs check
// that begins the datapath's open, the netlink socket that ends it, the
// VPC lock, the first and last bpf(2) after it, and, for DEL, the longest
// netlink request (RTM_DELLINK), and the record's rename or unlink.
func verbPhases(verb string, ev []traced) ([]phase, error) {
	first := func(pred func(int, traced) bool) int {
		for i, e := range ev {
			if pred(i, e) {
				return i
			}
		}
		return -1
	}
	last := func(pred func(traced) bool) int {
		for i := len(ev) - 1; i >= 0; i-- {
			if pred(ev[i]) {
				return i
			}
		}
		return -1
	}
	named := func(n string) func(traced) bool { return func(e traced) bool { return e.name == n } }
	stdin := first(func(_ int, e traced) bool { return e.name == "read" && !strings.Contains(e.args, "fd:") })
	statfs := first(func(_ int, e traced) bool { return e.name == "statfs" })
	sock := first(func(_ int, e traced) bool { return e.name == "socket" })
	lastBPF := last(named("bpf"))
	exit := last(named("exit_group"))
	if min(stdin, statfs, sock, lastBPF, exit) < 0 {
		return nil, fmt.Errorf("%s: a mark is missing from the trace", verb)
	}
	end := func(i int) float64 { return ev[i].at + ev[i].took }
	head := []phase{
		{"start", end(stdin)},
		{"parse", ev[statfs].at - end(stdin)},
		{"open", ev[sock].at - ev[statfs].at},
	}
	switch verb {
	case "ADD":
		lock := first(func(_ int, e traced) bool { return e.name == "flock" })
		firstBPF := first(func(i int, e traced) bool { return e.name == "bpf" && i > lock })
		rename := last(func(e traced) bool { return strings.HasPrefix(e.name, "rename") })
		if min(lock, firstBPF, rename) < 0 {
			return nil, fmt.Errorf("ADD: a mark is missing from the trace")
		}
		return append(head,
			phase{"lock", end(lock) - ev[sock].at},
			phase{"tap", ev[firstBPF].at - end(lock)},
			phase{"rows", end(lastBPF) - ev[firstBPF].at},
			phase{"record", end(rename) - end(lastBPF)},
			phase{"exit", ev[exit].at - end(rename)}), nil
	default:
		dellink := -1
		for i, e := range ev {
			if e.name == "sendmsg" && (dellink < 0 || e.took > ev[dellink].took) {
				dellink = i
			}
		}
		unlink := last(named("unlinkat"))
		if min(dellink, unlink) < 0 {
			return nil, fmt.Errorf("DEL: a mark is missing from the trace")
		}
		return append(head,
			phase{"find", ev[dellink].at - ev[sock].at},
			phase{"dellink", ev[dellink].took},
			phase{"rows", end(lastBPF) - end(dellink)},
			phase{"record", end(unlink) - end(lastBPF)},
			phase{"exit", ev[exit].at - end(unlink)}), nil
	}
}

// BenchmarkCNIVerbPhases breaks the built plugin's ADD and DEL into phases
// (docs/datapath.md, "Where a CNI verb's milliseconds go"): each verb run
// as a runtime runs it, under `perf trace` (Debian's linux-perf), and cut
// at the system calls that begin and end each phase (verbPhases). Each
// figure is the median over the iterations, in ms:
//
//	start   exec, the Go runtime, package init, until the request is read
//	parse   reading and checking the request
//	open    opening the daemon's pins (and, for ADD, the pinned program)
//	lock    ADD: the netlink socket and the VPC's lock
//	tap     ADD: making the tap and its routes (netlink, TUNSETIFF)
//	rows    ADD: the eBPF rows, the TCX attach and its pin; DEL: clearing them
//	record  writing (ADD) or removing (DEL) the record, and temp files
//	find    DEL: the lock, the records, reading and probing the tap
//	dellink DEL: the RTM_DELLINK request, which the kernel answers once the
//	        device is unregistered
//	exit    the result and the process's end
//
// Run it on an idle machine: perf trace adds a little to each traced call,
// and the phases are what an idle node pays. The first ADD, which verifies
// the program, is run untraced before. GALACTICTEST_PHASES_PLUGIN names
// another build of the plugin to break down instead of this tree's (an
// older one, for a before and after; its pins' layout must be this tree's).
func BenchmarkCNIVerbPhases(b *testing.B) {
	perf, err := exec.LookPath("perf")
	if err != nil {
		b.Skip("perf is not installed (apt-get install linux-perf): it traces the verbs")
	}
	plugin := tapPlugin
	if p := os.Getenv("GALACTICTEST_PHASES_PLUGIN"); p != "" {
		plugin = p
	}
	h := newCNIHost(b)
	h.plugin = plugin
	conf := h.conf("f", nil)
	h.mustCNI("ADD", fmt.Sprintf("%064x", 0), conf)
	h.mustCNI("DEL", fmt.Sprintf("%064x", 0), conf)
	dir := b.TempDir()
	wrap := filepath.Join(dir, "traced-plugin")
	script := fmt.Sprintf("#!/bin/sh\nexec %s trace -o %s/$CNI_COMMAND.$$ -e %s -- %s\n", perf, dir, phaseSyscalls, plugin)
	if err := os.WriteFile(wrap, []byte(script), 0o755); err != nil {
		b.Fatal(err)
	}
	h.plugin = wrap
	i := 0
	for b.Loop() {
		i++
		h.mustCNI("ADD", fmt.Sprintf("%064x", i), conf)
		h.mustCNI("DEL", fmt.Sprintf("%064x", i), conf)
	}
	b.StopTimer()
	for _, verb := range []string{"ADD", "DEL"} {
		paths, err := filepath.Glob(filepath.Join(dir, verb+".*"))
		if err != nil || len(paths) == 0 {
			b.Fatalf("no traces of %s in %s (%v)", verb, dir, err)
		}
		byPhase := map[string][]float64{}
		var order []string
		for _, p := range paths {
			ev, err := readTrace(p)
			if err != nil {
				b.Fatal(err)
			}
			phases, err := verbPhases(verb, ev)
			if err != nil {
				b.Fatalf("%s: %v", p, err)
			}
			for _, ph := range phases {
				if _, ok := byPhase[ph.name]; !ok {
					order = append(order, ph.name)
				}
				byPhase[ph.name] = append(byPhase[ph.name], ph.ms)
			}
		}
		total := 0.0
		for _, name := range order {
			m := medianOf(byPhase[name])
			total += m
			b.ReportMetric(m, strings.ToLower(verb)+"-"+name+"-ms")
		}
		b.ReportMetric(total, strings.ToLower(verb)+"-ms")
	}
}

func medianOf(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
