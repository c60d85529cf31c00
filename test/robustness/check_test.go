package robustness

import (
	"os"
	"slices"
	"testing"
	"time"
)

// These tests judge handwritten histories: the checker is a function of a
// history, and each rule must fire on the history that breaks it and stay
// quiet on its neighbour that does not.

const tapA = "G00000001a001H"

var t0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// removedAt is a history where tapA (ifindex 7), made at 0 ms, is seen at
// seen ms and gone at gone ms, reported by a pass.
func removedAt(seen, gone int, extra ...Event) []Event {
	h := []Event{
		{At: at(0), Kind: TapMakeStart, Tap: tapA},
		{At: at(10), Kind: LinksSeen, Taps: map[string]uint32{tapA: 7}},
	}
	h = append(h, extra...)
	h = append(h,
		Event{At: at(gone), Kind: LinksSeen, Taps: map[string]uint32{}, Since: at(seen)},
		Event{At: at(gone + 5), Kind: Reported, Tap: tapA, Ifindex: 7, Pass: at(seen - 1).Format(time.RFC3339Nano)},
		Event{At: at(gone + 6), Kind: PassesSeen, Refs: []string{tapA + "/7"}},
	)
	slices.SortStableFunc(h, func(a, b Event) int { return a.At.Compare(b.At) })
	return h
}

func rules(vs []Violation) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Rule)
	}
	return out
}

func TestTheCheckerJudgesEachRule(t *testing.T) {
	r := Rules{MinCandidateAge: time.Second, Visible: 100 * time.Millisecond}
	for _, c := range []struct {
		name    string
		history []Event
		want    []string
	}{
		{"a stale tap removed after its age", removedAt(2000, 2020), nil},
		{"removed before its age", removedAt(500, 520), []string{RuleAge}},
		{"removed while held", removedAt(2000, 2020, Event{At: at(100), Kind: HoldOpened, Tap: tapA, Ifindex: 7}), []string{RuleHeld}},
		{"another incarnation held", removedAt(2000, 2020, Event{At: at(100), Kind: HoldOpened, Tap: tapA, Ifindex: 6}), nil},
		{"removed after its holder left", removedAt(2000, 2020,
			Event{At: at(100), Kind: HoldOpened, Tap: tapA, Ifindex: 7}, Event{At: at(500), Kind: HoldClosed, Tap: tapA, Ifindex: 7}), nil},
		{"removed too soon after an identity a pass saw", removedAt(2000, 2020,
			Event{At: at(1200), Kind: AttachmentCreated, Tap: tapA}, Event{At: at(1300), Kind: PassStart}, Event{At: at(1350), Kind: PassEnd},
			Event{At: at(1500), Kind: AttachmentDeleted, Tap: tapA}), []string{RuleAge}},
		{"an identity that lived between passes", removedAt(2000, 2020,
			Event{At: at(1200), Kind: AttachmentCreated, Tap: tapA}, Event{At: at(1500), Kind: AttachmentDeleted, Tap: tapA}), nil},
		{"removed while carried", removedAt(2000, 2020, Event{At: at(100), Kind: AttachmentCreated, Tap: tapA}), []string{RuleCarried}},
		{"carried only after the pass started", removedAt(2000, 2020, Event{At: at(2000), Kind: AttachmentCreated, Tap: tapA}), nil},
		{"removed by the harness's DEL", removedAt(500, 520,
			Event{At: at(400), Kind: RemoveStart, Tap: tapA}, Event{At: at(600), Kind: RemoveEnd, Tap: tapA})[:3], nil},
		{"removed while the brake held", removedAt(2000, 2020,
			Event{At: at(1500), Kind: BrakeSeen, Brake: &Brake{Engaged: true, Since: at(1400)}},
			Event{At: at(2030), Kind: BrakeSeen, Brake: &Brake{Engaged: true, Since: at(1400)}}), []string{RuleBrake}},
		{"removed by the release", removedAt(2000, 2020,
			Event{At: at(1500), Kind: BrakeSeen, Brake: &Brake{Engaged: true, Since: at(1400)}},
			Event{At: at(1990), Kind: ReleaseStart}, Event{At: at(2025), Kind: ReleaseEnd},
			Event{At: at(2030), Kind: BrakeSeen, Brake: &Brake{Engaged: true, Since: at(1400)}}), nil},
		{"reported by no pass", removedAt(2000, 2020)[:3:3], nil}, // no read of the passes: nothing to judge by
		{"a brake forgotten on restart", []Event{{At: at(5), Kind: RestartBrake, Brake: &Brake{Engaged: true, Since: at(1)}, After: &Brake{}}}, []string{RuleRestart}},
		{"a stale tap left", []Event{{At: at(0), Kind: TapMakeStart, Tap: tapA}, {At: at(9000), Kind: Settled, Taps: map[string]uint32{tapA: 7}}}, []string{RuleLiveness}},
		{"a live tap left", []Event{{At: at(0), Kind: AttachmentCreated, Tap: tapA}, {At: at(9000), Kind: Settled, Taps: map[string]uint32{tapA: 7}}}, nil},
		{"a stray temp file", []Event{{At: at(0), Kind: Residue, Detail: "a killed writer's temp file x"}}, []string{RuleResidue}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := rules(Check(c.history, r)); !slices.Equal(got, c.want) {
				t.Fatalf("rules broken: %v, want %v (%v)", got, c.want, Check(c.history, r))
			}
		})
	}

	t.Run("a removal reported late", func(t *testing.T) {
		h := removedAt(2000, 2020)
		late := append(slices.Clone(h[:3]), Event{At: at(2200), Kind: PassesSeen}, Event{At: at(2400), Kind: Reported, Tap: tapA, Ifindex: 7, Pass: at(1999).Format(time.RFC3339Nano)})
		if got := rules(Check(late, r)); !slices.Equal(got, []string{RuleLate}) {
			t.Fatalf("rules broken: %v, want %s", got, RuleLate)
		}
	})
	t.Run("a removal reported by none", func(t *testing.T) {
		h := removedAt(2000, 2020)
		none := append(slices.Clone(h[:3]), Event{At: at(2200), Kind: PassesSeen})
		if got := rules(Check(none, r)); !slices.Equal(got, []string{RuleLate, RuleUnreported}) {
			t.Fatalf("rules broken: %v, want %s and %s", got, RuleLate, RuleUnreported)
		}
	})
	t.Run("a removal reported that never happened", func(t *testing.T) {
		h := []Event{{At: at(5), Kind: Reported, Tap: tapA, Ifindex: 9, Pass: at(1).Format(time.RFC3339Nano)}}
		if got := rules(Check(h, r)); !slices.Equal(got, []string{RuleInvented}) {
			t.Fatalf("rules broken: %v, want %s", got, RuleInvented)
		}
	})
}

// TestCheckAHistory judges a kept history again, with this tree's checker:
// GALACTICTEST_ROBUSTNESS_HISTORY=<folder>/history.jsonl (a failure names
// the folder). Without it there is nothing to judge, and it says so.
func TestCheckAHistory(t *testing.T) {
	path := os.Getenv("GALACTICTEST_ROBUSTNESS_HISTORY")
	if path == "" {
		t.Skip("a replay tool: set GALACTICTEST_ROBUSTNESS_HISTORY to a kept history.jsonl")
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	events, err := ReadHistory(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %s", path, Summary(events))
	for _, v := range Check(events, Rules{MinCandidateAge: minAge, Visible: visible}) {
		t.Errorf("%s", v)
	}
}
