package integration

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/link"
)

// BenchmarkAddStorm200 runs 200 ADDs of the built plugin into one VPC, each
// a process of its own as a runtime runs it, first one after another and
// then all started at once (a node starting 200 pods of one tenant), with
// every tap deleted between the two so both start from none. Every ADD of
// the storm waits for the same VRF lock. It reports the storm's wall time
// against the sequential run's, the longest single ADD of the storm (the
// plugin gives up on the lock after 30 s), and the plugin's CPU time
// (user+sys) per ADD in the storm against sequential: what waiting for the
// lock costs beyond the work itself. failed-adds counts ADDs of either
// phase that did not succeed (a lock timeout answers "try again later").
func BenchmarkAddStorm200(b *testing.B) {
	const count = 200
	for b.Loop() {
		h := newCNIHost(b)
		adds := make([]stormAdd, count)
		for i := range adds {
			adds[i] = stormAdd{container: fmt.Sprintf("%064x", i), conf: h.conf(identity.Attachment(1000+i).Base62(), nil)}
		}
		// One ADD and DEL first, so neither phase pays for a cold binary.
		warm := stormAdd{container: fmt.Sprintf("%064x", count), conf: h.conf(identity.Attachment(1000+count).Base62(), nil)}
		h.mustCNI("ADD", warm.container, warm.conf)
		h.mustCNI("DEL", warm.container, warm.conf)

		seq := stormPhase(h, adds, false)
		stormDelAll(h, adds)
		par := stormPhase(h, adds, true)
		stormDelAll(h, adds)

		b.ReportMetric(par.wall.Seconds()/seq.wall.Seconds(), "parallel-x-of-sequential")
		b.ReportMetric(par.maxAdd.Seconds(), "max-add-s")
		b.ReportMetric(par.cpu.Seconds()/seq.cpu.Seconds(), "cpu-x-of-sequential")
		b.ReportMetric(float64(seq.wall.Milliseconds())/count, "seq-ms/add")
		b.ReportMetric(float64(seq.failed+par.failed), "failed-adds")
	}
}

type stormAdd struct {
	container string
	conf      []byte
}

type stormResult struct {
	wall, maxAdd, cpu time.Duration
	failed            int
}

// stormPhase runs every ADD, one after another or all started at once.
// CPU is the plugin process's own user and system time (ip netns exec execs
// it, so the child's rusage is the plugin's).
func stormPhase(h *cniHost, adds []stormAdd, parallel bool) stormResult {
	var (
		mu  sync.Mutex
		res stormResult
	)
	run := func(a stormAdd) {
		cmd := h.command("ADD", a.container, a.conf)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		err := cmd.Run()
		took := time.Since(start)
		mu.Lock()
		defer mu.Unlock()
		res.maxAdd = max(res.maxAdd, took)
		if cmd.ProcessState != nil {
			res.cpu += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		}
		if err != nil {
			res.failed++
			if res.failed <= 3 {
				h.t.Logf("ADD %s after %v: %v: %.300s", a.container[56:], took, err, out.String())
			}
		}
	}
	start := time.Now()
	if parallel {
		var wg sync.WaitGroup
		for _, a := range adds {
			wg.Go(func() { run(a) })
		}
		wg.Wait()
	} else {
		for _, a := range adds {
			run(a)
		}
	}
	res.wall = time.Since(start)
	return res
}

// stormDelAll deletes every ADD's tap so the next phase starts from none.
func stormDelAll(h *cniHost, adds []stormAdd) {
	for _, a := range adds {
		h.mustCNI("DEL", a.container, a.conf)
	}
	links, err := h.host.Dial(h.t).Links(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	if taps := link.TenantTaps(links); len(taps) != 0 {
		h.t.Fatalf("%d tenant taps left after every DEL", len(taps))
	}
}
