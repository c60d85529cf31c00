// Command galactic-hubctl is the hub's fabric-identity controller: it gives
// every live Network a fabric identity from an address claim, and gives a
// gone network's claim back to the quota while its block stays retained.
// Instances elect a leader on a Lease; only the leader acts.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/datum-cloud/galactic-node/hubctl"
	"github.com/datum-cloud/galactic-node/internal/buildinfo"
	"github.com/datum-cloud/galactic-node/internal/buildinfo/buildmetric"
	"github.com/datum-cloud/galactic-node/internal/cli"
	"github.com/datum-cloud/galactic-node/internal/envflag"
	"github.com/datum-cloud/galactic-node/internal/logging"
	"github.com/datum-cloud/galactic-node/internal/logging/klogroute"
	"github.com/datum-cloud/galactic-node/internal/metricsserve"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const prog = "galactic-hubctl"

// leaseFirstReadTimeout bounds the read of the retention lease at start.
const leaseFirstReadTimeout = 10 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := cli.Exit(os.Stderr, prog, runEnv(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
	stop()
	os.Exit(code)
}

// runEnv runs the controller with the environment environ (os.Environ's
// form), so that tests set GALACTIC_* without touching the process's.
func runEnv(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "version", "--version", "-version":
			if len(args) > 1 {
				return cli.Misuse(prog, fmt.Errorf("%s takes no arguments", args[0]))
			}
			fmt.Fprintln(stdout, buildinfo.Version(version))
			return nil
		case "help":
			args = []string{"--help"}
		}
	}
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	platform := fs.String("platform-namespace", "", "the platform's one namespace, where fabric-identity claims live (required)")
	className := fs.String("class-name", "", "address class of the claims (default: the address service's)")
	leaseNS := fs.String("lease-namespace", "", "namespace of the leader Lease (default: --platform-namespace)")
	leaseName := fs.String("lease-name", "galactic-hubctl", "name of the leader Lease")
	id := fs.String("id", "", "this instance's identity in the election (default: the hostname)")
	workers := fs.Int("workers", hubctl.DefaultWorkers, "networks reconciled in parallel (collects share one read of the networks past the cache)")
	listen := fs.String("listen", ":9181", "address of /metrics, /healthz and /readyz")
	logFormat := fs.String("log-format", "json", "json or text")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	// client-go's default of 5 requests/s with a burst of 10 starves a hub:
	// a release is five requests, so 150 deletes waited minutes on the
	// limiter. These defaults let a hub settle a burst of churn in seconds
	// while still bounding what one controller can ask of the API server.
	qps := fs.Float64("kube-api-qps", hubctl.DefaultKubeAPIQPS, "requests per second to the API server, sustained")
	burst := fs.Int("kube-api-burst", hubctl.DefaultKubeAPIBurst, "requests to the API server in a burst")
	leaseDuration := fs.Duration("leader-elect-lease-duration", hubctl.DefaultLeaseTiming.Duration,
		"how long a follower waits after the last renewal before it takes the Lease: the failover time after a crash")
	renewDeadline := fs.Duration("leader-elect-renew-deadline", hubctl.DefaultLeaseTiming.RenewDeadline,
		"how long the leader tries to renew before it gives up leading; shorter than the lease duration")
	retryPeriod := fs.Duration("leader-elect-retry-period", hubctl.DefaultLeaseTiming.RetryPeriod,
		"how often instances try to acquire or renew the Lease")
	minLease := fs.Duration("min-retention-lease", hubctl.DefaultMinRetentionLease,
		"release no claim while the address service's retention lease for the claims is shorter than this (docs/operations.md, \"Retention leases\")")
	relist := fs.Duration("relist-interval", hubctl.DefaultRelistInterval,
		"list claims and allocations afresh at least this often, for an address service that resumes a watch without the events it missed; 0 relists only on a refused watch")
	placement := fs.String("placement", "karmada",
		"karmada: place each fabric identity at its network's locations with a Karmada ClusterPropagationPolicy, and remove it when the network goes (docs/hub.md, \"Placement\"); none: place nothing, for a hub without Karmada")
	synopsis := prog + " --platform-namespace NS [flags]\n       " + prog + " version | --version"
	if err := cli.Parse(fs, synopsis, args, environ, envflag.Names(fs), stdout); err != nil {
		return err
	}
	if *qps <= 0 || *burst <= 0 {
		return cli.Misuse(prog, fmt.Errorf("--kube-api-qps %v and --kube-api-burst %d: want both above 0", *qps, *burst))
	}
	timing := hubctl.LeaseTiming{Duration: *leaseDuration, RenewDeadline: *renewDeadline, RetryPeriod: *retryPeriod}
	if err := timing.Validate(); err != nil {
		return cli.Misuse(prog, err)
	}
	if *platform == "" {
		return cli.Misuse(prog, errors.New("--platform-namespace is required"))
	}
	if *minLease < 0 || *relist < 0 {
		return cli.Misuse(prog, fmt.Errorf("--min-retention-lease %s and --relist-interval %s: want neither negative", *minLease, *relist))
	}
	if *placement != "karmada" && *placement != "none" {
		return cli.Misuse(prog, fmt.Errorf("--placement %q: want karmada or none", *placement))
	}
	if *leaseNS == "" {
		*leaseNS = *platform
	}
	if *id == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("--id not given and no hostname: %w", err)
		}
		*id = h
	}
	log, err := logging.New(stderr, *logFormat, *logLevel)
	if err != nil {
		return cli.Misuse(prog, err)
	}
	log = log.With("id", *id)
	// client-go's informers and leader election log through klog.
	klogroute.Into(log)

	var cfg *rest.Config
	if *kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", *kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("kubernetes configuration: %w", err)
	}
	cfg.QPS, cfg.Burst = float32(*qps), *burst
	// Replicas share one service account: the instance in the user agent
	// tells them apart in the API server's audit log.
	cfg.UserAgent = fmt.Sprintf("%s/%s (%s)", prog, buildinfo.Version(version), *id)
	cfg.Wrap(hubctl.FenceTransport)
	// One REST client for the controller's requests and its informers, so
	// that --kube-api-qps bounds them together.
	rc, err := hubctl.NewRESTClient(cfg)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildmetric.Collector(buildinfo.Version(version)))
	metrics, err := hubctl.NewMetrics(reg)
	if err != nil {
		return err
	}
	// The fence the leader's writes hold: none lands after its lease may
	// have passed to another replica (a replica paused past its lease).
	fence := hubctl.NewLeaseFence(timing)
	metrics.SetMinRetentionLease(*minLease)
	kube := hubctl.NewKube(rc, cs, *platform, "galactic-hubctl")
	defer kube.Shutdown()
	dyn := kube.Dynamic()
	var ctl *hubctl.Controller
	networks, err := hubctl.NewNetworkInformer(dyn, func(ns, name string) { ctl.Enqueue(ns, name) })
	if err != nil {
		return err
	}
	claims, err := hubctl.NewClaimInformer(dyn, *platform, hubctl.ClaimEvents{
		Bound: func(ns, name string) { ctl.ClaimBound(ns, name) },
		Gone:  func() { ctl.ClaimGone() },
	}, *relist)
	if err != nil {
		return err
	}
	allocations, err := hubctl.NewAllocationInformer(dyn, *platform, *relist)
	if err != nil {
		return err
	}
	identities, err := hubctl.NewFabricIdentityInformer(dyn, func(ns, name string) { ctl.IdentityChanged(ns, name) })
	if err != nil {
		return err
	}
	leases := hubctl.NewLeaseWatcher(dyn, *className, metrics)
	var place hubctl.Placement = hubctl.NoPlacement{}
	var placer *hubctl.Placer
	var placementInformers *hubctl.PlacementInformers
	placementSynced := func() bool { return true }
	if *placement == "karmada" {
		placementInformers, err = hubctl.NewPlacementInformers(dyn, networks, identities, hubctl.PlacementEvents{
			Context: func(ns, name string) { ctl.ContextChanged(ns, name) },
			Policy: func(ns, name string, present bool) {
				if !present {
					placer.PolicyGone(hubctl.Key{Namespace: ns, Name: name})
				}
				ctl.PolicyChanged(ns, name, present)
			},
		})
		if err != nil {
			return err
		}
		placer = hubctl.NewPlacer(kube, placementInformers, fence, metrics, log)
		place, placementSynced = placer, placementInformers.HasSynced
	}
	// The informers' handlers call ctl and placer only once they run,
	// after this.
	ctl = hubctl.New(kube, networks, place, metrics, log,
		hubctl.Config{PlatformNamespace: *platform, ClassName: *className, Workers: *workers, Fence: fence,
			Claims: claims, Allocations: allocations, Identities: identities,
			Leases: leases, MinRetentionLease: *minLease})
	go networks.Run(ctx)
	go claims.Run(ctx)
	go allocations.Run(ctx)
	go identities.Run(ctx)
	if placementInformers != nil {
		go placementInformers.Run(ctx)
	}
	logLease := func(l hubctl.RetentionLease, err error) {
		if err != nil {
			log.Warn("retention lease of the claims cannot be read; releases are held", "error", err)
			return
		}
		log.Info("retention lease of the claims", "lease", l.String(), "min_retention_lease", *minLease)
	}
	// Read before leading, so that no release is held for want of a
	// first read; bounded, so that an API server that does not answer
	// delays the probes by no more than that (releases stay held until a
	// read succeeds).
	rctx, cancel := context.WithTimeout(ctx, leaseFirstReadTimeout)
	leaseErr := leases.Refresh(rctx)
	cancel()
	first, _ := leases.RetentionLease()
	logLease(first, leaseErr)
	go leases.Run(ctx, logLease)

	if *listen != "" {
		l, err := net.Listen("tcp", *listen)
		if err != nil {
			return fmt.Errorf("listen %s: %w", *listen, err)
		}
		ready := func(context.Context) error {
			if !networks.HasSynced() || !claims.HasSynced() || !allocations.HasSynced() || !identities.HasSynced() {
				return errors.New("network, claim, allocation or fabric identity cache not synced")
			}
			if !placementSynced() {
				return errors.New("network context or placement policy cache not synced: is Karmada's ClusterPropagationPolicy served? (--placement=none runs without)")
			}
			if ctl.Blind() {
				return fmt.Errorf("fabric identities exist but no claim or allocation is in view in namespace %s: are the credentials scoped to the platform project?", *platform)
			}
			return nil
		}
		// The node daemon's listener, bounds and probes (internal/metricsserve),
		// and the controller's status.
		bounded := metricsserve.Limit(l, "metrics", log)
		reg.MustRegister(bounded.Collectors("metrics")...)
		mux := http.NewServeMux()
		mux.Handle("/", metricsserve.Handler(reg, nil, ready))
		mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(ctl.Status())
		})
		srv := metricsserve.NewServer(mux, log)
		go func() { _ = srv.Serve(bounded) }()
		defer func() { _ = srv.Close() }()
		log.Info("serving metrics and health", "address", l.Addr().String())
	}

	log.Info("galactic-hubctl starting", "version", buildinfo.Version(version), "platform_namespace", *platform, "lease", *leaseNS+"/"+*leaseName,
		"kube_api_qps", cfg.QPS, "kube_api_burst", cfg.Burst, "lease_duration", timing.Duration,
		"renew_deadline", timing.RenewDeadline, "retry_period", timing.RetryPeriod,
		"min_retention_lease", *minLease, "relist_interval", *relist, "placement", *placement)
	err = hubctl.RunAsLeader(ctx, cs, *leaseNS, *leaseName, *id, timing, func(lctx context.Context) {
		log.Info("leading: reconciling")
		if !cache.WaitForCacheSync(lctx.Done(), networks.HasSynced, claims.HasSynced, allocations.HasSynced, identities.HasSynced, placementSynced) {
			return
		}
		ctl.Run(lctx)
	}, hubctl.WithFence(fence), hubctl.WithMetrics(metrics))
	if err != nil {
		return err
	}
	if ctx.Err() == nil {
		return errors.New("leadership lost; exiting so that a fresh instance campaigns again")
	}
	log.Info("stopped")
	return nil
}
