package hub

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/datum-cloud/galactic-node/test/framework/chaostest"
)

// TestMain runs three scenes at a time. A scene waits on its processes
// and its API server far more than it computes, and each runs an API
// server of its own (a hub sees every network of its cluster, and the
// audit log is the checker's evidence, so two scenes cannot share one):
// two at a time, -parallel's default on two cores, would outlast the
// package's budget; all six at once would crowd the other packages `make
// test` runs beside this one. An explicit -parallel still wins.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "3")
	}
	// envtest's client logs through controller-runtime's logger, which
	// prints a stack trace of its own when no one set it.
	ctrllog.SetLogger(logr.Discard())
	code := m.Run()
	// The binaries are the run's own; the kept histories name no binary.
	if built.product != "" {
		_ = os.RemoveAll(filepath.Dir(built.product))
	}
	os.Exit(code)
}

// The random phase's length in `make test`, and how long a settled hub
// may take (under load, after the last fault, its failover included).
const (
	defaultRandom = 20 * time.Second
	variantRandom = 15 * time.Second
	settleBound   = 60 * time.Second
	// caughtBound bounds the random phase of a variant that must be
	// caught, which stops at its first violation: the steady networks are
	// claimed before it starts, and the first fault comes within 4 s.
	caughtBound = time.Minute
)

// durationEnv, a Go duration, runs the random phase of each model's scene
// for that long instead (`make robustness DURATION=1h`).
const durationEnv = "GALACTICTEST_ROBUSTNESS_DURATION"

func randomPhase(t *testing.T) time.Duration {
	v := os.Getenv(durationEnv)
	if v == "" {
		return defaultRandom
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive Go duration", durationEnv, v)
	}
	return d
}

// TestHubRobustness runs the built hub, two replicas, under random work and
// faults, against each model of the address service, and checks the
// history: no live network loses or changes its identity, no block is
// ever two networks', and, settled, no gone network holds a unit while no
// live one waits for a free one. GALACTICTEST_CHAOS_SEED replays a seed.
func TestHubRobustness(t *testing.T) {
	t.Parallel()
	bins := binaries(t)
	for _, model := range []string{modelCRD, modelIpam} {
		t.Run(model, func(t *testing.T) {
			t.Parallel()
			cfg := sceneConfig{model: model, binary: bins.product, seed: chaostest.Seed(), random: randomPhase(t), settle: settleBound}
			res := mustRun(t, cfg)
			if len(res.violations) > 0 {
				t.Fatalf("seed %d: %d violation(s); the first: %s\nhistory: %s\nreplay: GALACTICTEST_CHAOS_SEED=%d go test -run 'TestHubRobustness/%s$' ./test/robustness/hub/",
					cfg.seed, len(res.violations), res.violations[0], keep(t, res.dir), cfg.seed, model)
			}
			t.Logf("seed %d: no violation in %s (%s)", cfg.seed, res.took.Round(time.Millisecond), summary(res.dir))
		})
	}
}

// variants are the broken hubs (hubctl/testhooks.go) the checker must
// catch, or that a run shows harmless, and why.
var variants = []struct {
	name   string
	caught bool
	why    string
}{
	// The rule "a network is collected only after a read past the cache
	// says it is gone" switched off: the first leader to take over sweeps
	// every claim as a gone network's, deleting live networks' identities
	// and releasing their claims.
	{"direct-read-off", true, ""},
	// gather only batches: it delays a read until the collects in
	// progress have asked (at most maxGather), so that one LIST answers
	// them all. What makes the read safe is that it starts after every
	// ask it answers, which readBatches holds without gather; without it
	// there are more LISTs, and no other outcome.
	{"no-gather", false, "gather batches reads; every ask is still answered by a read that started after it"},
	// The check skips a claim whose delete was accepted and waits on
	// finalizers. Without it the release deletes that claim again, with
	// the same UID and resourceVersion as preconditions: the API server
	// answers 200 or 409 and changes nothing, or 404 once it is gone. What
	// is lost is accounting (a release counted and an event recorded
	// twice), which no rule of the checker, nor of the hub, is about.
	{"no-deleting-check", false, "a second delete of a claim already being deleted changes nothing"},
	// ClaimGone wakes the networks waiting for a quota unit or for their
	// own claim to go, and opens the window in which a quota refusal is
	// retried quickly. Lost, such a network is retried on its backoff
	// alone (1 s doubling, at most MaxDelay, 5 min; and every leader
	// reconciles every network when it starts): its identity comes late,
	// never wrong, and no unit, claim or block is taken or kept by it. A
	// run of seconds ends with the backoff shorter than the settle bound,
	// so the settled check sees the network claimed.
	{"lost-wakeup", false, "a lost wakeup delays a waiting network to its backoff; nothing is taken or kept"},
}

// TestHubRobustnessCatchesBrokenVariants runs the hooked build, one variant
// broken at a time, for a short while against the CRD model, stopping at
// the first violation: a variant expected caught must be, and one shown
// harmless must break no rule.
func TestHubRobustnessCatchesBrokenVariants(t *testing.T) {
	t.Parallel()
	bins := binaries(t)
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			cfg := sceneConfig{model: modelCRD, binary: bins.hooked, variant: v.name, seed: chaostest.Seed(),
				random: variantRandom, settle: settleBound, stopEarly: true}
			if v.caught {
				// Until caught: the faults go on, and every failover's
				// sweep is one more chance. The bound is for a checker
				// that misses it, which then fails.
				cfg.random = caughtBound
			}
			res := mustRun(t, cfg)
			switch {
			case v.caught && len(res.violations) == 0:
				t.Fatalf("the checker missed variant %s (seed %d)\nhistory: %s", v.name, cfg.seed, keep(t, res.dir))
			case v.caught:
				t.Logf("caught %s %s into the random phase (seed %d): %s", v.name,
					res.violations[0].T.Sub(res.randomStart).Round(time.Millisecond), cfg.seed, res.violations[0])
			case len(res.violations) > 0:
				t.Fatalf("variant %s, run as harmless (%s), broke a rule (seed %d): %s\nhistory: %s",
					v.name, v.why, cfg.seed, res.violations[0], keep(t, res.dir))
			default:
				t.Logf("%s breaks no rule in %s (seed %d): %s", v.name, res.took.Round(time.Millisecond), cfg.seed, v.why)
			}
		})
	}
}

// mustRun runs a scene, failing the test with the seed on a setup error.
func mustRun(t *testing.T, cfg sceneConfig) sceneResult {
	t.Helper()
	res, err := runScene(t, cfg)
	if err != nil {
		t.Fatalf("seed %d: %v\nfiles: %s", cfg.seed, err, keep(t, res.dir))
	}
	// The history's reads and stores come from one audit file: had the
	// API server rotated it, what went to the rotated file is missing
	// from the history, and the verdicts rest on a gap.
	if rotated, _ := filepath.Glob(filepath.Join(res.dir, "audit-*.log")); len(rotated) > 0 {
		t.Fatalf("seed %d: the API server rotated its audit log (%s): the history misses what went there\nfiles: %s", cfg.seed, rotated[0], keep(t, res.dir))
	}
	return res
}

// keep copies a scene's history and logs out of t.TempDir, which the test
// removes, into a folder of its own that stays, and returns the history's
// path there.
func keep(t *testing.T, dir string) string {
	kept, err := os.MkdirTemp("", "hub-robustness-*")
	if err != nil {
		t.Logf("keep the history: %v", err)
		return filepath.Join(dir, "history.jsonl") + " (removed when the test ends)"
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() || e.Name() == "kubeconfig" {
			continue
		}
		if err := copyFile(filepath.Join(dir, e.Name()), filepath.Join(kept, e.Name())); err != nil {
			t.Logf("keep %s: %v", e.Name(), err)
		}
	}
	return filepath.Join(kept, "history.jsonl")
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return fmt.Errorf("copy: %w", err)
	}
	return out.Close()
}

// summary counts what a scene's history holds: its operations and faults,
// the replicas' reads past their caches, and the identities let go under a
// re-created network on such a read.
func summary(dir string) string {
	events, err := ReadHistory(filepath.Join(dir, "history.jsonl"))
	if err != nil {
		return err.Error()
	}
	counts := map[string]int{}
	for _, e := range events {
		switch e.Kind {
		case KindOp, KindFault:
			counts[e.What]++
		case KindRead:
			counts["read"]++
		}
	}
	var parts []string
	for _, k := range []string{"create", "delete", "sigkill", "sigstop", "exit", "read"} {
		parts = append(parts, fmt.Sprintf("%d %s", counts[k], k))
	}
	parts = append(parts, fmt.Sprintf("%d re-create race(s) excused by a read", Excused(events)))
	return strings.Join(parts, ", ")
}
