// Package metricsserve is the listener both daemons, galactic-node and
// galactic-hubctl, serve /metrics, /healthz and /readyz on: the one place
// its bounds (connections, header size, time, concurrent scrapes) and its
// probes are written. Any host on the node's network may reach it, so the
// probes answer anyone and say only "ok", "stuck", "ready" or "not ready";
// the reasons are in the log and on the admin API.
package metricsserve

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/datum-cloud/galactic-node/internal/connlimit"
)

const (
	// MaxHeaderBytes is plenty for a scrape or a kubelet probe.
	MaxHeaderBytes = 4 << 10
	// Connection bounds: in all, from one remote address, and from the
	// node itself (the kubelet's probes and a local scrape keep slots of
	// their own, so remote callers cannot starve them).
	MaxConns          = 64
	MaxConnsPerSource = 8
	MaxConnsFromHost  = 8
	// MaxScrapes bounds concurrent /metrics requests (503 beyond): a scrape
	// of the node daemon walks every eBPF map.
	MaxScrapes = 4
	// ScrapeTimeout bounds one scrape's gathering.
	ScrapeTimeout = 20 * time.Second
)

// Probe is a health check: nil when healthy.
type Probe func(context.Context) error

// Live serves a liveness probe: 200 "ok", or 503 "stuck" when live fails
// (the kubelet then restarts the container). A nil live is always ok.
func Live(live Probe) http.HandlerFunc {
	return probe(live, "ok", "stuck")
}

// Ready serves a readiness probe: 200 "ready", or 503 "not ready".
func Ready(ready Probe) http.HandlerFunc {
	return probe(ready, "ready", "not ready")
}

func probe(check Probe, good, bad string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if check != nil && check(r.Context()) != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, bad)
			return
		}
		fmt.Fprintln(w, good)
	}
}

// Handler serves reg's metrics on /metrics, at most MaxScrapes at once
// (the handler's own errors counted in reg too), and the probes beside
// them.
func Handler(reg *prometheus.Registry, live, ready Probe) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, MaxRequestsInFlight: MaxScrapes, Timeout: ScrapeTimeout}))
	mux.HandleFunc("GET /healthz", Live(live))
	mux.HandleFunc("GET /readyz", Ready(ready))
	return mux
}

// NewServer wraps h in an http.Server with small headers and short
// timeouts.
func NewServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       30 * time.Second,
		MaxHeaderBytes:    MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// Limit bounds l's connections; name says which listener in the log and
// on the listener metrics.
func Limit(l net.Listener, name string, log *slog.Logger) *connlimit.Listener {
	return connlimit.New(l, connlimit.Limits{Total: MaxConns, PerSource: MaxConnsPerSource, Self: MaxConnsFromHost}, name, log)
}
