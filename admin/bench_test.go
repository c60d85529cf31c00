package admin_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/admin"
)

// BenchmarkPendingWithAuthAt64Clients drives GET /v1/taps/pending with a
// bearer token from 64 concurrent keep-alive clients over loopback, and in
// the same run a bare net/http handler that writes the same bytes without
// routing or auth. It reports each one's requests per second and p99
// latency, and x-of-bare, the throughput ratio.
func BenchmarkPendingWithAuthAt64Clients(b *testing.B) {
	const clients = 64
	tokens, err := admin.LoadTokenFile(tokenFile(b, "admin "+adminToken+"\nread "+readToken+"\n"))
	if err != nil {
		b.Fatal(err)
	}
	backend := &fakeBackend{}
	ours := admin.NewHandler(admin.BackendOf(backend), admin.Config{Tokens: tokens, Log: slog.New(slog.DiscardHandler)})
	body, _ := json.MarshalIndent(map[string]any{"items": backend.Pending()}, "", "  ")
	bare := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
	serve := func(h http.Handler) string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		s := &http.Server{Handler: h}
		go func() { _ = s.Serve(l) }()
		b.Cleanup(func() { _ = s.Close() })
		return "http://" + l.Addr().String() + "/v1/taps/pending"
	}
	oursURL, bareURL := serve(ours), serve(bare)

	run := func(url string, requests int) (rps float64, p99 time.Duration) {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}}
		var mu sync.Mutex
		var lat []time.Duration
		var wg sync.WaitGroup
		next := make(chan struct{}, requests)
		for range requests {
			next <- struct{}{}
		}
		close(next)
		start := time.Now()
		for range clients {
			wg.Go(func() {
				var mine []time.Duration
				for range next {
					req, _ := http.NewRequest("GET", url, nil)
					req.Header.Set("Authorization", "Bearer "+readToken)
					t0 := time.Now()
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
					mine = append(mine, time.Since(t0))
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
		}
		wg.Wait()
		elapsed := time.Since(start)
		slices.Sort(lat)
		return float64(len(lat)) / elapsed.Seconds(), lat[len(lat)*99/100]
	}

	const perRound = 2000
	var oursRPS, bareRPS float64
	var oursP99, bareP99 time.Duration
	for b.Loop() {
		r, p := run(oursURL, perRound)
		oursRPS, oursP99 = oursRPS+r, max(oursP99, p)
		b.StopTimer()
		r, p = run(bareURL, perRound)
		bareRPS, bareP99 = bareRPS+r, max(bareP99, p)
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(oursRPS/n, "req/s")
	b.ReportMetric(bareRPS/n, "bare-req/s")
	b.ReportMetric(oursRPS/bareRPS, "x-of-bare")
	b.ReportMetric(float64(oursP99.Microseconds()), "p99-µs")
	b.ReportMetric(float64(bareP99.Microseconds()), "bare-p99-µs")
}
