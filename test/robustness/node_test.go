package robustness

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/datum-cloud/galactic-node/test/framework/chaostest"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

const (
	// minAge is the daemon's --min-candidate-age here: long beside a
	// forced pass, so that a removal before it is unmistakable.
	minAge = time.Second
	// attachmentsPerRun is how many identities a run plays with: enough
	// for the brake's mass rule (3 and half the node's taps) to fire.
	attachmentsPerRun = 10
	// visible bounds how long after a removal is seen a read of
	// /v1/passes may still not list it: not at all. The pass in flight
	// names a tap as removing before it sends the delete, so the first
	// read that starts after the links were read without the tap names
	// it; a build that lists a removal once the kernel answered (tens of
	// milliseconds on a loaded machine) or once its pass ended does not.
	visible = 0
)

// budget is how long the random phase of the main run lasts:
// GALACTICTEST_ROBUSTNESS_DURATION (a Go duration; `make robustness
// DURATION=1h`), else a bound that keeps `make test` within its budget.
func budget(def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv("GALACTICTEST_ROBUSTNESS_DURATION")); err == nil && d > 0 {
		return d
	}
	return def
}

// weights say how often each operation is drawn.
type weights map[string]int

var workload = weights{
	"create": 10, "delete": 7, "mass-delete": 1, "add": 12, "del": 8, "killed-add": 4,
	"hold": 6, "unhold": 6, "pass": 24, "release": 4, "cli-add": 3, "cli-del": 2, "gc": 3,
	"kill": 1, "kill-mid-pass": 1, "partition": 1, "slow": 1, "api-restart": 0, "idle": 8, "kill-braked": 2,
}

func (w weights) with(over weights) weights {
	out := weights{}
	for k, v := range w {
		out[k] = v
	}
	for k, v := range over {
		out[k] = v
	}
	return out
}

// leaned is the workload with GALACTICTEST_ROBUSTNESS_LEAN's weights
// ("killed-add=40,hold=0") over it: a longer run aimed at one suspicion.
func leaned(t *testing.T, w weights) weights {
	spec := os.Getenv("GALACTICTEST_ROBUSTNESS_LEAN")
	if spec == "" {
		return w
	}
	over := weights{}
	for _, kv := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(kv, "=")
		n, err := strconv.Atoi(v)
		if _, known := w[k]; !ok || err != nil || n < 0 || !known {
			t.Fatalf("GALACTICTEST_ROBUSTNESS_LEAN=%q: want operation=weight pairs, comma-separated, of %v", spec, slices.Sorted(maps.Keys(w)))
		}
		over[k] = n
	}
	return w.with(over)
}

func (w weights) draw(rng *rand.Rand) string {
	keys := make([]string, 0, len(w))
	total := 0
	for k, v := range w {
		keys = append(keys, k)
		total += v
	}
	slices.Sort(keys) // a seed replays only if the order is fixed
	n := rng.IntN(total)
	for _, k := range keys {
		if n < w[k] {
			return k
		}
		n -= w[k]
	}
	return keys[len(keys)-1]
}

// run is one robustness run: a scene, its history, the model of what the
// harness did, and the faults in force.
type run struct {
	*scene
	h    *History
	rng  *rand.Rand
	seed uint64
	w    weights

	created map[int]bool   // attachments stored at the API server
	pods    map[int]string // attachments whose pod the runtime has: its container ID
	cliTaps map[int]bool   // taps made by `tap add`
	holders map[int]*nettest.Holder
	// heldIndex is the ifindex each holder opened: the tap it holds.
	heldIndex map[int]uint32
	engaged   bool // as the observer last read it
	serial    int

	heal     func()
	healAt   time.Time
	slowTill time.Time
	apiDown  bool
	apiUpAt  time.Time

	counts map[string]int
	stop   chan struct{}
	wg     sync.WaitGroup
}

func newRun(t *testing.T, s *scene, seed uint64, w weights) *run {
	h, err := NewHistory(filepath.Join(s.dir, "history.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	return &run{scene: s, h: h, seed: seed, w: w, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		created: map[int]bool{}, pods: map[int]string{}, cliTaps: map[int]bool{}, holders: map[int]*nettest.Holder{}, heldIndex: map[int]uint32{},
		counts: map[string]int{}, stop: make(chan struct{})}
}

// observe reads the node's taps, its pass reports and its brake every few
// milliseconds, and records what changed.
func (r *run) observe() {
	defer r.wg.Done()
	var prev map[string]uint32
	var prevAt, changedAt time.Time
	seen := map[string]bool{}
	var lastBrake *Brake
	for {
		select {
		case <-r.stop:
			return
		case <-time.After(15 * time.Millisecond):
		}
		now := time.Now()
		taps, err := r.tenantTaps()
		if err != nil {
			continue
		}
		changed := prev == nil || !mapsEqual(prev, taps)
		if changed {
			r.h.Add(Event{At: now, Kind: LinksSeen, Taps: taps, Since: prevAt})
			changedAt = now
		}
		prev, prevAt = taps, now
		if !r.up() {
			continue
		}
		readAt := time.Now() // what the daemon had listed by then, at least
		if reps, err := r.passes(); err == nil {
			var refs []string
			for _, rep := range reps {
				for _, x := range rep.Removing {
					refs = append(refs, ref(x.Name, x.Ifindex))
				}
				for _, x := range rep.Reclaimed {
					key := rep.Started + " " + ref(x.Name, x.Ifindex)
					refs = append(refs, ref(x.Name, x.Ifindex))
					if !seen[key] {
						seen[key] = true
						r.h.Add(Event{Kind: Reported, Tap: x.Name, Ifindex: x.Ifindex, Pass: rep.Started, Detail: rep.Result})
					}
				}
			}
			if time.Since(changedAt) < 3*time.Second {
				r.h.Add(Event{At: readAt, Kind: PassesSeen, Refs: refs})
			}
		}
		if b, err := r.brake(); err == nil {
			if lastBrake == nil || !lastBrake.Same(b) || time.Since(changedAt) < 3*time.Second {
				r.h.Add(Event{Kind: BrakeSeen, Brake: &b})
			}
			lastBrake = &b
			r.mu.Lock()
			r.engaged = b.Engaged
			r.mu.Unlock()
		}
	}
}

func mapsEqual(a, b map[string]uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func (r *run) op(detail string, args ...any) {
	r.h.Add(Event{Kind: Op, Detail: fmt.Sprintf(detail, args...)})
}

// removing records a window in which the harness may remove tap ("" for
// any), around fn.
func (r *run) removing(tap string, fn func() error) error {
	r.serial++
	id := fmt.Sprint(r.serial)
	r.h.Add(Event{Kind: RemoveStart, Tap: tap, Detail: id})
	err := fn()
	r.h.Add(Event{Kind: RemoveEnd, Tap: tap, Detail: id})
	return err
}

func (r *run) pick(set func(att int) bool) (int, bool) {
	var atts []int
	for a := 1; a <= attachmentsPerRun; a++ {
		if set(a) {
			atts = append(atts, a)
		}
	}
	if len(atts) == 0 {
		return 0, false
	}
	return atts[r.rng.IntN(len(atts))], true
}

// step draws one operation or fault and carries it out.
func (r *run) step(faults bool) {
	r.endFaults(false)
	kind := r.w.draw(r.rng)
	r.counts[kind]++
	switch kind {
	case "create":
		if a, ok := r.pick(func(a int) bool { return !r.created[a] }); ok && !r.apiDown {
			if err := r.createAttachment(a); err != nil {
				r.op("create %d: %v", a, err)
				return
			}
			r.created[a] = true
			r.h.Add(Event{Kind: AttachmentCreated, Tap: r.tapName(a)})
		}
	case "delete":
		if a, ok := r.pick(func(a int) bool { return r.created[a] }); ok && !r.apiDown {
			r.deleteOne(a)
		}
	case "mass-delete":
		// A namespace deleted, or `kubectl delete --all`: every identity
		// of the run goes at once, and the next pass meets the brake.
		for a := 1; a <= attachmentsPerRun && !r.apiDown; a++ {
			if r.created[a] {
				r.deleteOne(a)
			}
		}
		r.force("pass after a mass delete")
	case "add":
		// A runtime adds a pod whose attachment the cluster holds.
		if a, ok := r.pick(func(a int) bool { return r.created[a] && r.pods[a] == "" && !r.cliTaps[a] }); ok {
			r.serial++
			ctr := fmt.Sprintf("ctr-%d-%d", a, r.serial)
			r.h.Add(Event{Kind: TapMakeStart, Tap: r.tapName(a), Detail: ctr})
			err := r.inHost(func(ctx context.Context) error {
				_, err := r.cni.AddNetworkList(ctx, r.conf(a), r.rt(ctr))
				return err
			})
			r.pods[a] = ctr // a failed ADD is DELed by the runtime too
			r.op("ADD %s (attachment %d): %v", ctr, a, err)
		}
	case "killed-add":
		if a, ok := r.pick(func(a int) bool { return r.created[a] && r.pods[a] == "" && !r.cliTaps[a] }); ok {
			r.serial++
			ctr := fmt.Sprintf("ctr-%d-%d", a, r.serial)
			delay := time.Duration(r.rng.IntN(40_000)) * time.Microsecond
			if r.rng.IntN(2) == 0 {
				delay = -1 // at its record's temp file
			}
			r.h.Add(Event{Kind: TapMakeStart, Tap: r.tapName(a), Detail: ctr})
			// A tap the killed ADD had not yet persisted goes with it:
			// a removal window of the harness's, as a DEL's is.
			r.h.Add(Event{Kind: RemoveStart, Tap: r.tapName(a), Detail: "killed ADD " + ctr})
			err := r.killedAdd(a, ctr, delay)
			r.afterKilledAdd(r.tapName(a))
			r.h.Add(Event{Kind: RemoveEnd, Tap: r.tapName(a)})
			r.pods[a] = ctr
			r.op("ADD %s (attachment %d) SIGKILLed after %s: %v", ctr, a, delay, err)
		}
	case "del":
		if a, ok := r.pick(func(a int) bool { return r.pods[a] != "" }); ok {
			ctr := r.pods[a]
			delete(r.pods, a)
			if r.rng.IntN(5) == 0 {
				r.op("DEL of %s lost: the runtime never runs it", ctr)
				return
			}
			err := r.removing(r.tapName(a), func() error {
				return r.inHost(func(ctx context.Context) error { return r.cni.DelNetworkList(ctx, r.conf(a), r.rt(ctr)) })
			})
			r.op("DEL %s (attachment %d): %v", ctr, a, err)
		}
	case "gc":
		var valid []types.GCAttachment
		for _, ctr := range r.pods {
			valid = append(valid, types.GCAttachment{ContainerID: ctr, IfName: "eth0"})
		}
		err := r.removing("", func() error {
			return r.inHost(func(ctx context.Context) error {
				return r.cni.GCNetworkList(ctx, r.conf(1), &libcni.GCArgs{ValidAttachments: valid})
			})
		})
		r.op("GC keeping %d attachments: %v", len(valid), err)
	case "hold":
		if a, ok := r.pick(func(a int) bool { return r.holders[a] == nil }); ok {
			name := r.tapName(a)
			// A VMM opening a tap that is not there makes one of its
			// own, which goes with its last file: hold only what is
			// there (unhold still counts as a removal, for the race).
			taps, err := r.tenantTaps()
			if err != nil || taps[name] == 0 {
				return
			}
			h, err := r.hold(name)
			if err != nil {
				r.op("hold %s: %v", name, err)
				return
			}
			// The VMM holds this incarnation: a tap made again under the
			// name is another, which it does not hold.
			r.holders[a] = h
			r.heldIndex[a] = taps[name]
			r.h.Add(Event{Kind: HoldOpened, Tap: name, Ifindex: taps[name]})
		}
	case "unhold":
		if a, ok := r.pick(func(a int) bool { return r.holders[a] != nil }); ok {
			r.unhold(a)
		}
	case "pass":
		r.force("forced pass")
	case "release":
		r.mu.Lock()
		engaged := r.engaged
		r.mu.Unlock()
		if engaged && r.up() {
			r.release()
		}
	case "cli-add":
		if a, ok := r.pick(func(a int) bool { return r.pods[a] == "" && !r.cliTaps[a] }); ok {
			r.h.Add(Event{Kind: TapMakeStart, Tap: r.tapName(a), Detail: "tap add"})
			out, err := r.cli(r.tapArgs("add", a)...)
			r.cliTaps[a] = true
			r.op("tap add %d: %v %s", a, err, strings.TrimSpace(string(out)))
		}
	case "cli-del":
		if a, ok := r.pick(func(a int) bool { return r.cliTaps[a] }); ok {
			var out []byte
			err := r.removing(r.tapName(a), func() error {
				var err error
				out, err = r.cli(r.tapArgs("del", a)...)
				return err
			})
			if err == nil {
				delete(r.cliTaps, a)
			}
			r.op("tap del %d: %v %s", a, err, strings.TrimSpace(string(out)))
		}
	case "idle":
		// Nothing happens for a while, as on most nodes most of the
		// time: candidates come of age.
		time.Sleep(time.Duration(200+r.rng.IntN(800)) * time.Millisecond)
	case "kill-braked":
		// The restart an incident brings: a liveness probe, an OOM kill,
		// a rollout, while the brake holds.
		r.mu.Lock()
		engaged := r.engaged
		r.mu.Unlock()
		if faults && engaged {
			r.fault("kill")
		}
	case "kill", "kill-mid-pass", "partition", "slow", "api-restart":
		if faults {
			r.fault(kind)
		}
	}
}

// force runs a pass, as `galactic-node pass` does, and records what it did.
func (r *run) force(what string) {
	r.h.Add(Event{Kind: PassStart, Detail: what})
	code, body, err := r.call("POST", "/v1/passes")
	r.h.Add(Event{Kind: PassEnd, Detail: what})
	var rep struct {
		Result, Reason                         string
		Candidates, Confirmed, Reclaimed, Held []json.RawMessage
	}
	if err == nil && code == http.StatusOK && json.Unmarshal(body, &rep) == nil {
		r.op("%s: %s %s: %d candidates, %d confirmed, %d reclaimed, %d held", what, rep.Result, rep.Reason,
			len(rep.Candidates), len(rep.Confirmed), len(rep.Reclaimed), len(rep.Held))
		return
	}
	r.op("%s: %d %v %.200s", what, code, err, body)
}

func (r *run) deleteOne(a int) {
	r.h.Add(Event{Kind: AttachmentDeleted, Tap: r.tapName(a)})
	r.created[a] = false
	if err := r.deleteAttachment(a); err != nil {
		r.op("%v", err)
	}
}

// unhold ends a VMM. It is a removal window too: had the tap gone between
// the check and the open, the VMM's open made a tap of its own, which
// goes with it.
func (r *run) unhold(a int) {
	name := r.tapName(a)
	r.h.Add(Event{Kind: HoldClosed, Tap: name, Ifindex: r.heldIndex[a]})
	_ = r.removing(name, func() error { r.holders[a].Release(); return nil })
	delete(r.holders, a)
	delete(r.heldIndex, a)
}

// release is the operator's `galactic-node pass --allow-mass-removal`.
func (r *run) release() {
	r.serial++
	id := fmt.Sprint(r.serial)
	r.h.Add(Event{Kind: ReleaseStart, Detail: id})
	r.h.Add(Event{Kind: PassStart, Detail: "release"})
	out, err := r.cli("pass", "--allow-mass-removal", "--socket", r.socket)
	r.h.Add(Event{Kind: PassEnd, Detail: "release"})
	r.h.Add(Event{Kind: ReleaseEnd, Detail: id})
	r.op("release the brake: %v %.300s", err, strings.TrimSpace(string(out)))
}

// fault injects one fault.
func (r *run) fault(kind string) {
	switch kind {
	case "kill":
		// SIGKILLed between passes: the brake must read the same after.
		before, errBefore := r.brake()
		r.h.Add(Event{Kind: DaemonKilled, Detail: "between passes"})
		r.killDaemon()
		r.restart()
		after, errAfter := r.brake()
		if errBefore == nil && errAfter == nil {
			r.h.Add(Event{Kind: RestartBrake, Brake: &before, After: &after})
		}
	case "kill-mid-pass":
		if !r.up() {
			r.restart()
			return
		}
		delay := time.Duration(r.rng.IntN(60_000)) * time.Microsecond
		done := make(chan struct{})
		r.h.Add(Event{Kind: PassStart, Detail: "to be killed"})
		go func() {
			defer close(done)
			defer r.h.Add(Event{Kind: PassEnd, Detail: "to be killed"})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, _, _ = r.callCtx(ctx, "POST", "/v1/passes")
		}()
		time.Sleep(delay)
		r.h.Add(Event{Kind: DaemonKilled, Detail: fmt.Sprintf("%s into a forced pass", delay)})
		r.killDaemon()
		<-done
		r.restart()
	case "partition":
		if r.heal != nil {
			return
		}
		heal := r.partition()
		d := time.Duration(1+r.rng.IntN(4)) * time.Second
		r.h.Add(Event{Kind: FaultStart, Detail: "partition from the API server for " + d.String()})
		r.heal, r.healAt = heal, time.Now().Add(d)
	case "slow":
		d := time.Duration(200+r.rng.IntN(1500)) * time.Millisecond
		r.delay.Store(int64(d))
		r.slowTill = time.Now().Add(time.Duration(2+r.rng.IntN(4)) * time.Second)
		r.h.Add(Event{Kind: FaultStart, Detail: "API server answers held back " + d.String()})
	case "api-restart":
		if r.apiDown {
			return
		}
		r.h.Add(Event{Kind: FaultStart, Detail: "API server stopped"})
		if err := r.cluster.Env.ControlPlane.APIServer.Stop(); err != nil {
			r.op("stop the API server: %v", err)
		}
		r.apiDown, r.apiUpAt = true, time.Now().Add(time.Duration(2+r.rng.IntN(4))*time.Second)
	}
}

// endFaults ends the faults whose time is up, or all of them.
func (r *run) endFaults(all bool) {
	now := time.Now()
	if r.heal != nil && (all || now.After(r.healAt)) {
		r.heal()
		r.heal = nil
		r.h.Add(Event{Kind: FaultEnd, Detail: "partition healed"})
	}
	if !r.slowTill.IsZero() && (all || now.After(r.slowTill)) {
		r.delay.Store(0)
		r.slowTill = time.Time{}
		r.h.Add(Event{Kind: FaultEnd, Detail: "API server answers at once"})
	}
	if r.apiDown && (all || now.After(r.apiUpAt)) {
		if err := r.cluster.Env.ControlPlane.APIServer.Start(); err != nil {
			r.t.Fatalf("start the API server again: %v", err)
		}
		r.apiDown = false
		r.h.Add(Event{Kind: FaultEnd, Detail: "API server started"})
	}
}

func (r *run) restart() {
	if err := r.startDaemon(); err != nil {
		r.t.Fatalf("restart the daemon: %v (seed %d)", err, r.seed)
	}
	r.h.Add(Event{Kind: DaemonStarted})
}

// settle stops every fault and every hold, then gives the daemon what the
// liveness rule allows: the minimum age and three passes, the brake
// released where it engaged. It records the node's taps then, and what
// they do not explain.
func (r *run) settle() {
	r.endFaults(true)
	if !r.up() {
		r.restart()
	}
	r.h.Add(Event{Kind: Quiet})
	for a := range r.holders {
		r.unhold(a)
	}
	pass := func() { r.force("settling pass") }
	pass()
	time.Sleep(minAge + 100*time.Millisecond)
	pass()
	if b, err := r.brake(); err == nil && b.Engaged {
		r.release()
	}
	pass()
	time.Sleep(100 * time.Millisecond) // one more read of the observer
	taps, err := r.tenantTaps()
	if err != nil {
		r.t.Fatalf("list the taps: %v", err)
	}
	r.h.Add(Event{Kind: Settled, Taps: taps})
	for _, what := range r.residue(taps) {
		r.h.Add(Event{Kind: Residue, Detail: what})
	}
}

// drive runs the random phase for d, or until caught says stop.
func (r *run) drive(d time.Duration, faults bool, caught func([]Violation) bool) {
	r.restart()
	r.wg.Add(1)
	go r.observe()
	end := time.Now().Add(d)
	for i := 0; time.Now().Before(end); i++ {
		r.step(faults)
		if caught != nil && i%5 == 4 && caught(Check(r.h.Events(), r.rules())) {
			return
		}
	}
}

func (r *run) rules() Rules { return Rules{MinCandidateAge: minAge, Visible: visible} }

func (r *run) finish() []Violation {
	close(r.stop)
	r.wg.Wait()
	if err := r.h.Close(); err != nil {
		r.t.Error(err)
	}
	return Check(r.h.Events(), r.rules())
}

// keep copies the run's history and daemon log where they outlive the
// test, and returns the folder.
func (r *run) keep() string {
	dir, err := os.MkdirTemp("", "galactic-robustness-")
	if err != nil {
		return "(not kept: " + err.Error() + ")"
	}
	for _, f := range []string{"history.jsonl", "daemon.log"} {
		if b, err := os.ReadFile(filepath.Join(r.dir, f)); err == nil {
			_ = os.WriteFile(filepath.Join(dir, f), b, 0o600)
		}
	}
	return dir
}

// story is the events about tap, and the faults around them: the short
// history a failure is read by.
func story(events []Event, tap string) string {
	var b strings.Builder
	present := false
	for _, e := range events {
		show := e.Tap == tap
		switch e.Kind {
		case DaemonKilled, DaemonStarted, ReleaseStart, ReleaseEnd, Quiet, FaultStart, FaultEnd, RestartBrake:
			show = true
		case RemoveStart, RemoveEnd:
			show = show || e.Tap == ""
		case LinksSeen:
			_, now := e.Taps[tap]
			show = now != present
			present = now
		}
		if show {
			fmt.Fprintf(&b, "\t%s %-19s %s %s %s\n", clock(e.At), e.Kind, e.Tap, e.Pass, e.Detail)
		}
	}
	return b.String()
}

// TestTheNodeUnderRandomWorkAndFaults is the robustness run: random work
// and faults from a fresh seed (GALACTICTEST_CHAOS_SEED replays one) for
// the budget, then faults stop and the history must show no violation.
func TestTheNodeUnderRandomWorkAndFaults(t *testing.T) {
	seed := chaostest.Seed()
	cluster := clustertest.Shared(t)
	r := newRun(t, newScene(t, cluster, 1, bins.daemon, nil), seed, leaned(t, workload))
	start := time.Now()
	r.drive(budget(90*time.Second), true, nil)
	r.settle()
	vs := r.finish()
	events := r.h.Events()
	t.Logf("seed %d: %s of random work: %s", seed, time.Since(start).Round(time.Second), Summary(events))
	t.Logf("operations drawn: %v", r.counts)
	t.Logf("figures: %s", figures(events, r.counts))
	if os.Getenv("GALACTICTEST_ROBUSTNESS_KEEP") != "" {
		t.Logf("history and daemon log kept in %s", r.keep())
	}
	if len(vs) > 0 {
		kept := r.keep()
		var b strings.Builder
		for i, v := range vs {
			if i == 10 {
				fmt.Fprintf(&b, "... and %d more\n", len(vs)-i)
				break
			}
			fmt.Fprintf(&b, "%s\n%s", v, story(events, v.Tap))
		}
		t.Fatalf("%d violations (seed %d; replay with GALACTICTEST_CHAOS_SEED=%d; history and daemon log in %s):\n%s", len(vs), seed, seed, kept, b.String())
	}
}

// figures are a run's counts for docs/robustness.md: operations carried
// out, faults injected, and removals the daemon's reports listed.
func figures(events []Event, drawn map[string]int) string {
	ops := 0
	for _, n := range drawn {
		ops += n
	}
	faults, removals := 0, map[string]bool{}
	for _, e := range events {
		switch e.Kind {
		case DaemonKilled, FaultStart:
			faults++
		case Reported:
			removals[ref(e.Tap, e.Ifindex)] = true
		}
	}
	faults += drawn["killed-add"]
	return fmt.Sprintf("%d operations drawn, %d faults (daemon SIGKILLs, API faults, plugin SIGKILLs), %d removals by the daemon", ops, faults, len(removals))
}
