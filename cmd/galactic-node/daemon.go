package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/datum-cloud/galactic-node/admin"
	"github.com/datum-cloud/galactic-node/admin/kubeauth"
	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/internal/buildinfo"
	"github.com/datum-cloud/galactic-node/internal/buildinfo/buildmetric"
	"github.com/datum-cloud/galactic-node/internal/cli"
	"github.com/datum-cloud/galactic-node/internal/connlimit"
	"github.com/datum-cloud/galactic-node/internal/logging"
	"github.com/datum-cloud/galactic-node/internal/logging/klogroute"
	"github.com/datum-cloud/galactic-node/internal/metricsserve"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/cnicache"
	"github.com/datum-cloud/galactic-node/node/cnitap"
	"github.com/datum-cloud/galactic-node/node/dropwatch"
	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/node/inventory/kubeinventory"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/nodeview"
	"github.com/datum-cloud/galactic-node/node/reclaim"
	"github.com/datum-cloud/galactic-node/node/reclaim/reclaimmetrics"
	"github.com/datum-cloud/galactic-node/node/routewatch"
	"github.com/datum-cloud/galactic-node/node/teardown"
	"github.com/datum-cloud/galactic-node/node/tun/holder"
	"github.com/datum-cloud/galactic-node/node/vrf"
)

type daemonFlags struct {
	nodeName, kubeconfig, inventoryFile   string
	interval, minCandidateAge             time.Duration
	inventoryMaxAge, proofTimeout         time.Duration
	dryRun                                bool
	maxReclaims, massRemovalMin           int
	massRemovalShare, shrinkShare         float64
	shrinkWindow, brakeReleaseAfter       time.Duration
	bpffs, vrfLockDir, cniDataDir         string
	cniCacheDirs                          string
	layoutRecord                          string
	adminSocket, adminListen              string
	adminTLSCert, adminTLSKey, adminToken string
	adminKubeAuth                         bool
	adminForcesPerMinute                  int
	adminReadGroup                        string
	metricsListen, logFormat, logLevel    string
	shutdownTimeout, passStuckAfter       time.Duration
}

// daemonFlagSet defines the flags of galactic-node run into f.
func daemonFlagSet(f *daemonFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("galactic-node run", flag.ContinueOnError)
	fs.StringVar(&f.nodeName, "node-name", "", "this node's name (default $NODE_NAME, then the hostname)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	fs.StringVar(&f.inventoryFile, "inventory-file", "", "read the inventory from this YAML file instead of the cluster")
	fs.DurationVar(&f.interval, "interval", time.Minute, "time between passes; 0 runs passes only when forced")
	fs.DurationVar(&f.minCandidateAge, "min-candidate-age", 5*time.Minute, "how long a tap must have been seen stale before a pass may remove it, on top of two passes; 0 only for labs and tests")
	fs.DurationVar(&f.inventoryMaxAge, "inventory-max-age", 5*time.Minute, "readiness fails when the newest consistent read of the API server that succeeded started longer ago than this (watch events do not count: they may arrive late); the daemon probes with one every quarter of this (at least every 1s; every 75s with 0), so an API server or link d behind keeps the age at d or more; 0 disables")
	fs.DurationVar(&f.proofTimeout, "inventory-proof-timeout", 10*time.Second, "bound on each request (each page of 5000 objects, each probe) of the consistent reads of the API server; the read that must precede every removal has as many pages as there are objects")
	fs.BoolVar(&f.dryRun, "dry-run", false, "compute and report every pass, remove nothing")
	fs.IntVar(&f.maxReclaims, "max-reclaims-per-pass", reclaim.DefaultMaxReclaimsPerPass, "cap on removals per pass, the rest roll over (0: no cap)")
	fs.Float64Var(&f.massRemovalShare, "mass-removal-share", reclaim.DefaultMassRemovalShare, "the brake engages, and passes remove nothing, when the taps confirmed stale at once are more than this share of the node's stamped taps and at least --mass-removal-min (1 turns this rule off)")
	fs.IntVar(&f.massRemovalMin, "mass-removal-min", reclaim.DefaultMassRemovalMin, "fewest taps confirmed stale at once, or identities gone from the inventory, that may engage the brake")
	fs.Float64Var(&f.shrinkShare, "inventory-shrink-share", reclaim.DefaultInventoryShrinkShare, "the brake engages when the identities the cluster carries fell by more than this share of their peak within --inventory-shrink-window while a pass has taps to remove (1 turns this rule off)")
	fs.DurationVar(&f.shrinkWindow, "inventory-shrink-window", reclaim.DefaultShrinkWindow, "how far back the inventory's peak is looked for")
	fs.DurationVar(&f.brakeReleaseAfter, "mass-removal-release-after", reclaim.DefaultBrakeReleaseAfter, "an engaged brake releases on its own once the inventory has shrunk no further for this long (0: only `galactic-node pass --allow-mass-removal` releases it)")
	fs.StringVar(&f.bpffs, "bpffs", "/sys/fs/bpf", "bpf filesystem; maps are pinned under <bpffs>/galactic")
	fs.StringVar(&f.layoutRecord, "layout-record", datapath.DefaultLayoutRecord, "where to record the pinned maps' layout once opened, which install-cni checks a new plugin against (empty: none)")
	fs.StringVar(&f.vrfLockDir, "vrf-lock-dir", vrf.DefaultDir, "folder of the per-VRF lock files shared with the CNI plugin")
	fs.StringVar(&f.cniCacheDirs, "cni-cache-dirs", strings.Join(cnicache.DefaultDirs(), ","),
		"libcni's cache folders (the runtime's, Multus'), comma-separated: a tap an older build made is bound to the MAC and addresses its cached ADD gave it (empty: taps of older builds stay unbound until their next ADD)")
	fs.StringVar(&f.cniDataDir, "cni-data-dir", cnitap.DefaultDataDir, "the CNI plugin's records; each interval the daemon removes those whose tap is gone, which a removed network's GC never would (empty disables)")
	fs.StringVar(&f.adminSocket, "admin-socket", "/run/galactic/admin.sock", "admin API unix socket, mode 0600, in a folder only its owner may write (empty disables)")
	fs.StringVar(&f.adminListen, "admin-listen", "", "admin API TCP address; TLS required unless loopback")
	fs.StringVar(&f.adminTLSCert, "admin-tls-cert", "", "TLS certificate for --admin-listen")
	fs.StringVar(&f.adminTLSKey, "admin-tls-key", "", "TLS key for --admin-listen")
	fs.StringVar(&f.adminToken, "admin-token-file", "", "admin tokens, one \"<read|admin> <token>\" a line, mode 0600 or 0400; reloaded on change, revoked while missing")
	fs.BoolVar(&f.adminKubeAuth, "admin-kube-auth", false, "also accept Kubernetes tokens: TokenReview, then SubjectAccessReview on nodes.galactic.datum.net")
	fs.IntVar(&f.adminForcesPerMinute, "admin-forces-per-minute", 6, "forced passes allowed a minute before 429; 0 disables forced passes")
	fs.StringVar(&f.adminReadGroup, "admin-read-group", "", "group (name or gid) whose members may read the admin API over the socket with no token; root may do anything there")
	fs.StringVar(&f.metricsListen, "metrics-listen", ":9180", "Prometheus metrics address (empty disables)")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long the pass in flight may finish and the servers drain; below the pod's terminationGracePeriodSeconds")
	fs.DurationVar(&f.passStuckAfter, "pass-stuck-after", 10*time.Minute, "/healthz fails (and the liveness probe restarts the daemon) when a pass has run this long, or none started for --interval plus this")
	fs.StringVar(&f.logFormat, "log-format", "json", "json or text")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	return fs
}

// parseDaemonFlags parses and checks the flags of galactic-node run; every
// error it returns is a usage mistake (internal/cli).
func parseDaemonFlags(args, environ []string, stdout io.Writer) (*daemonFlags, error) {
	f, err := parseDaemonFlagsUnchecked(args, environ, stdout)
	var u *cli.UsageError
	if err != nil && !errors.Is(err, flag.ErrHelp) && !errors.As(err, &u) {
		err = cli.Misuse("galactic-node run", err)
	}
	return f, err
}

func parseDaemonFlagsUnchecked(args, environ []string, stdout io.Writer) (*daemonFlags, error) {
	f := &daemonFlags{}
	fs := daemonFlagSet(f)
	if err := cli.Parse(fs, "galactic-node run [flags]", args, environ, knownEnv(), stdout); err != nil {
		return nil, err
	}
	if f.nodeName == "" {
		f.nodeName = os.Getenv("NODE_NAME")
	}
	if f.nodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("--node-name not given and no hostname: %w", err)
		}
		f.nodeName = h
	}
	if f.interval < 0 {
		return nil, errors.New("--interval must not be negative")
	}
	if f.proofTimeout <= 0 {
		return nil, errors.New("--inventory-proof-timeout must be positive")
	}
	if f.inventoryMaxAge < 0 {
		return nil, errors.New("--inventory-max-age must not be negative")
	}
	if f.minCandidateAge < 0 {
		return nil, errors.New("--min-candidate-age must not be negative")
	}
	if f.shutdownTimeout <= 0 {
		return nil, errors.New("--shutdown-timeout must be positive")
	}
	if f.passStuckAfter <= 0 {
		return nil, errors.New("--pass-stuck-after must be positive")
	}
	if f.maxReclaims < 0 {
		return nil, errors.New("--max-reclaims-per-pass must not be negative (0: no cap)")
	}
	if f.massRemovalShare <= 0 || f.shrinkShare <= 0 {
		return nil, errors.New("--mass-removal-share and --inventory-shrink-share must be positive (1 turns a rule off)")
	}
	if f.massRemovalMin < 1 {
		return nil, errors.New("--mass-removal-min must be at least 1")
	}
	if f.shrinkWindow <= 0 {
		return nil, errors.New("--inventory-shrink-window must be positive")
	}
	if f.brakeReleaseAfter < 0 {
		return nil, errors.New("--mass-removal-release-after must not be negative (0: only an operator releases the brake)")
	}
	if f.adminForcesPerMinute < 0 {
		return nil, errors.New("--admin-forces-per-minute must not be negative (0 disables forced passes)")
	}
	if f.adminListen != "" && f.adminToken == "" && !f.adminKubeAuth {
		return nil, errors.New("--admin-listen needs --admin-token-file or --admin-kube-auth: TCP callers have no kernel credentials")
	}
	if f.adminReadGroup != "" && f.adminSocket == "" {
		return nil, errors.New("--admin-read-group names who may read the admin socket, which --admin-socket= disables")
	}
	if (f.adminTLSCert == "") != (f.adminTLSKey == "") {
		return nil, errors.New("--admin-tls-cert and --admin-tls-key go together")
	}
	if f.adminListen != "" && f.adminTLSCert == "" && !isLoopback(f.adminListen) {
		return nil, fmt.Errorf("--admin-listen %s is not loopback: give --admin-tls-cert and --admin-tls-key", f.adminListen)
	}
	if f.adminKubeAuth && f.inventoryFile != "" && f.kubeconfig == "" && os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		return nil, errors.New("--admin-kube-auth needs a cluster: give --kubeconfig or run in-cluster")
	}
	return f, nil
}

// lookupGroup resolves a group name or number. The image has no
// /etc/group: there, give the number.
func lookupGroup(name string) (uint32, error) {
	if gid, err := strconv.ParseUint(name, 10, 32); err == nil {
		return uint32(gid), nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, fmt.Errorf("--admin-read-group %s: %w (give a gid where there is no /etc/group)", name, err)
	}
	gid, err := strconv.ParseUint(g.Gid, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("--admin-read-group %s: gid %q: %w", name, g.Gid, err)
	}
	return uint32(gid), nil
}

func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// probeInterval is how often the cluster inventory probes the API server
// with a consistent read for readiness's --inventory-max-age: four probes
// an age bound, so that one slow or lost probe does not fail readiness on
// its own, but no more than one a second (2 small requests each). With the
// bound off (0), the probe still feeds galactic_cni_inventory_age_seconds,
// whose alert fires beyond 5 min: a probe every 75 s, as for the default.
func probeInterval(maxAge time.Duration) time.Duration {
	if maxAge <= 0 {
		maxAge = 5 * time.Minute
	}
	return max(maxAge/4, time.Second)
}

func kubeConfig(path string) (*rest.Config, error) {
	if path != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster configuration (give --kubeconfig or --inventory-file outside a cluster): %w", err)
	}
	return cfg, nil
}

func runDaemon(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	f, err := parseDaemonFlags(args, environ, stdout)
	if err != nil {
		return err
	}
	log, err := logging.New(stderr, f.logFormat, f.logLevel)
	if err != nil {
		return cli.Misuse("galactic-node run", err)
	}
	log = log.With("node", f.nodeName)
	klogroute.Into(log)
	log.Info("galactic-node starting", "version", buildinfo.Version(version), "interval", f.interval, "min_candidate_age", f.minCandidateAge, "dry_run", f.dryRun,
		"max_reclaims_per_pass", f.maxReclaims, "bpffs", f.bpffs, "inventory_file", f.inventoryFile, "gc_percent", setGCPercent(environ))

	conn, err := link.Dial(nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	dp, err := datapath.Load(f.bpffs)
	if err != nil {
		return err
	}
	defer dp.Close()
	if m := dp.Migrated(); len(m) > 0 {
		log.Info("pinned maps of another capacity migrated: rows copied into maps of this build's, pins swapped", "maps", m)
	}
	if err := dp.AdoptProgram(); err != nil {
		return err
	}
	if f.layoutRecord != "" {
		if err := datapath.RecordLayout(f.layoutRecord); err != nil {
			return err
		}
	}
	registry := attachreg.New(dp, nil, log)
	if f.cniDataDir != "" && f.cniCacheDirs != "" {
		registry.Bindings = cnicache.Binder{DataDir: f.cniDataDir, CacheDirs: strings.Split(f.cniCacheDirs, ","),
			Owner: func(ifindex uint32) (string, string, error) {
				l, err := conn.Get(ctx, ifindex)
				return l.Name, l.Alias, err
			}}
	}
	// Taps attached by an earlier build run its rules until moved: before
	// anything else, and after every pass (afterEachPass).
	moveToCurrentProgram(ctx, registry, log)
	// Subscribed before anything runs, so that no change made after the
	// program's first cached answer goes unread.
	routes, err := routewatch.Dial(nil, dp, log.With("component", "route-watch"))
	if err != nil {
		return err
	}
	defer func() { _ = routes.Close() }()
	locks, err := vrf.NewLocker(f.vrfLockDir)
	if err != nil {
		return err
	}

	var cfg *rest.Config
	if f.inventoryFile == "" || f.adminKubeAuth {
		if cfg, err = kubeConfig(f.kubeconfig); err != nil {
			return err
		}
	}
	var inv inventory.Source
	if f.inventoryFile != "" {
		inv = inventory.NewFile(f.inventoryFile)
	} else {
		ci, err := kubeinventory.NewCluster(cfg, log, kubeinventory.Options{PageTimeout: f.proofTimeout, ProbeInterval: probeInterval(f.inventoryMaxAge)})
		if err != nil {
			return err
		}
		ci.Start(ctx)
		inv = ci
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildmetric.Collector(buildinfo.Version(version)))
	metrics, err := reclaimmetrics.NewMetrics(reg)
	if err != nil {
		return err
	}
	metrics.SetConfig(f.dryRun, f.interval)
	if p, ok := inv.(inventory.Prover); ok {
		if err := reclaimmetrics.RegisterInventoryAge(reg, p); err != nil {
			return err
		}
	}
	// The kernel probe decides whether a tap is free; without the tun
	// device every removal fails at stage probe, which the failures metric
	// and its alert show, while the maps the CNI plugin needs stay served.
	if err := holder.CanProbe(); err != nil {
		log.Error("no tap can be reclaimed: the kernel probe cannot open the tun device (mount the host's /dev/net/tun)", "error", err)
	}
	holders := holder.Proc{Root: "/proc"}
	if ok, why := holders.Scan(ctx).Complete(); !ok {
		log.Info("the holder scan cannot see every process: HOLDERS may miss some; removals do not depend on it", "why", why)
	}
	rcfg := reclaim.Config{DryRun: f.dryRun, MaxReclaimsPerPass: f.maxReclaims, MinCandidateAge: f.minCandidateAge,
		MassRemovalShare: f.massRemovalShare, MassRemovalMin: f.massRemovalMin, InventoryShrinkShare: f.shrinkShare,
		ShrinkWindow: f.shrinkWindow, BrakeReleaseAfter: f.brakeReleaseAfter, Prober: holder.Prober{Links: conn}}
	// The flags say 0 for "none"; the reclaim's zero values are defaults.
	if f.maxReclaims == 0 {
		rcfg.MaxReclaimsPerPass = -1
	}
	if f.brakeReleaseAfter == 0 {
		rcfg.BrakeReleaseAfter = -1
	}
	// Each pass may remove taps whose records then name nothing: the
	// record collection runs after it.
	passDone := make(chan struct{}, 1)
	reclaimer := reclaim.New(conn, inv, reclaimRegistry(registry, log), locks, passSignal{metrics, passDone}, log, rcfg)
	ag := &nodeview.Views{Links: conn, Inventory: inv, Reclaimer: reclaimer, Registry: registry, Datapath: dp, Holders: holders,
		MaxInventoryAge: f.inventoryMaxAge, Counters: dp}
	// The drop monitor reads the program's records of dropped frames
	// whether or not anyone follows them, so that the ring never fills
	// while nobody looks; a kernel without ring buffers leaves the node
	// without it, and says so (/v1/drops, the metrics).
	if mon, err := dp.OpenDropMonitor(); err != nil {
		ag.DropsUnavailable = err.Error()
		log.Warn("no drop monitor: galactic-node drops will have no records", "error", err)
	} else {
		ag.Drops = dropwatch.New(dropwatch.Config{Source: newDropSource(mon, conn), Log: log.With("component", "drop-monitor")})
	}
	if err := reg.Register(ag.MapCollector()); err != nil {
		return err
	}
	if err := reg.Register(ag.DecisionCollector()); err != nil {
		return err
	}

	var servers []*http.Server
	// stopBy bounds the whole shutdown: the pass in flight, then the
	// servers (a forced pass answering its caller) share one deadline.
	var stopBy time.Time
	defer func() {
		if stopBy.IsZero() {
			stopBy = time.Now().Add(f.shutdownTimeout)
		}
		shutdownCtx, cancel := context.WithDeadline(context.WithoutCancel(ctx), stopBy)
		defer cancel()
		for _, s := range servers {
			_ = s.Shutdown(shutdownCtx)
		}
	}()
	// serve bounds l's connections, counts them on the metrics, and
	// serves s on it.
	serve := func(s *http.Server, l *connlimit.Listener, what string) {
		reg.MustRegister(l.Collectors(what)...)
		servers = append(servers, s)
		var ln net.Listener = l
		if s.TLSConfig != nil {
			// TLS inside the bound: a handshake costs a slot, never more.
			ln = tls.NewListener(l, s.TLSConfig)
		}
		go func() {
			if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("server stopped", "server", what, "error", err)
			}
		}()
	}

	// live is the liveness probe, on the metrics port and the admin API.
	live := func(context.Context) error {
		err := reclaimer.Stuck(time.Now(), f.passStuckAfter)
		if err != nil {
			log.Error("liveness fails", "error", err)
		}
		return err
	}
	if f.adminSocket != "" || f.adminListen != "" {
		if f.adminForcesPerMinute == 0 {
			log.Info("forced passes are disabled (--admin-forces-per-minute 0)")
		}
		acfg := admin.Config{ForcesPerMinute: f.adminForcesPerMinute, Log: log, Version: buildinfo.Version(version), Node: f.nodeName, Peers: &admin.PeerPolicy{}, Live: live}
		if f.adminReadGroup != "" {
			gid, err := lookupGroup(f.adminReadGroup)
			if err != nil {
				return err
			}
			acfg.Peers.ReadGroup = &gid
		}
		if f.adminToken != "" {
			tokens, err := admin.LoadTokenFile(f.adminToken)
			if err != nil {
				return err
			}
			if tokens.Count() == 0 {
				if f.adminKubeAuth {
					log.Warn("no admin token is configured in the token file: only Kubernetes tokens are accepted", "path", f.adminToken)
				} else {
					log.Warn("no admin token is configured: every /v1 request is refused until the token file holds one", "path", f.adminToken)
				}
			}
			go tokens.Watch(ctx, time.Second, log)
			acfg.Tokens = tokens
		}
		if f.adminKubeAuth {
			// A review the API server never answers must not hold a
			// request (and its connection) forever.
			kcfg := rest.CopyConfig(cfg)
			kcfg.Timeout = 2 * kubeauth.ReviewTimeout
			cs, err := kubernetes.NewForConfig(kcfg)
			if err != nil {
				return fmt.Errorf("delegated auth client: %w", err)
			}
			acfg.Kube = kubeauth.New(cs, f.nodeName)
		}
		h := admin.NewHandler(admin.BackendOf(ag), acfg)
		if f.adminSocket != "" {
			l, err := admin.ListenUnix(f.adminSocket, acfg.Peers.ReadGroup)
			if err != nil {
				return err
			}
			serve(admin.NewServer(h, log), admin.LimitAdmin(l, "admin-socket", log), "admin-socket")
			log.Info("admin API listening", "socket", f.adminSocket)
		}
		if f.adminListen != "" {
			l, err := net.Listen("tcp", f.adminListen)
			if err != nil {
				return fmt.Errorf("admin listen %s: %w", f.adminListen, err)
			}
			s := admin.NewServer(h, log)
			if f.adminTLSCert != "" {
				cert, err := tls.LoadX509KeyPair(f.adminTLSCert, f.adminTLSKey)
				if err != nil {
					l.Close()
					return fmt.Errorf("admin TLS: %w", err)
				}
				s.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
			}
			serve(s, admin.LimitAdmin(l, "admin-tcp", log), "admin-tcp")
			log.Info("admin API listening", "address", l.Addr().String(), "tls", f.adminTLSCert != "")
		}
	}
	if f.metricsListen != "" {
		l, err := net.Listen("tcp", f.metricsListen)
		if err != nil {
			return fmt.Errorf("metrics listen %s: %w", f.metricsListen, err)
		}
		h := metricsserve.Handler(reg, live, ag.Ready)
		serve(metricsserve.NewServer(h, log), metricsserve.Limit(l, "metrics", log), "metrics")
		log.Info("metrics listening", "address", l.Addr().String())
	}

	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var wg sync.WaitGroup
	wg.Go(func() {
		// Without it the program's route answers go stale for 64 jiffies
		// after a change, so a watcher that fails stops the daemon, to be
		// restarted, rather than run on with the window open.
		if err := routes.Run(ctx); err != nil {
			log.Error("route watch failed: stopping", "error", err)
			stop(err)
		}
	})
	wg.Go(func() { reclaimer.Run(ctx, f.interval) })
	if ag.Drops != nil {
		wg.Go(func() {
			if err := ag.Drops.Run(ctx); err != nil {
				log.Error("drop monitor stopped", "error", err)
			}
		})
	}
	wg.Go(func() {
		// The move ran at start, before the servers; the records are
		// collected at start here.
		if f.cniDataDir != "" {
			collectRecords(ctx, f.cniDataDir, conn, locks, log)
		}
		afterEachPass(ctx, passDone, func() {
			moveToCurrentProgram(ctx, registry, log)
			if f.cniDataDir != "" {
				collectRecords(ctx, f.cniDataDir, conn, locks, log)
			}
		})
	})
	<-ctx.Done()
	stopBy = time.Now().Add(f.shutdownTimeout)
	log.Info("stopping: finishing the pass in flight", "timeout", f.shutdownTimeout.String())
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		log.Info("stopped")
	case <-time.After(time.Until(stopBy)):
		// Exiting mid-removal is safe: a link deleted before its rows
		// leaves orphan rows, which the next start's passes clear.
		log.Warn("stopping with a pass still in flight: the shutdown timeout ran out", "timeout", f.shutdownTimeout.String())
	}
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// afterEachPass runs job after each pass, until ctx ends.
func afterEachPass(ctx context.Context, passDone <-chan struct{}, job func()) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-passDone:
		}
		job()
	}
}

// moveToCurrentProgram points every attached tap at the daemon's program
// and unpins the programs no tap runs (attachreg.MoveToCurrentProgram).
func moveToCurrentProgram(ctx context.Context, registry *attachreg.Registry, log *slog.Logger) {
	sweep, err := registry.MoveToCurrentProgram(ctx)
	if err != nil && ctx.Err() == nil {
		log.Warn("some taps still run another program: retried after the next pass", "taps", sweep.Links, "moved", sweep.Moved,
			"on_other_program", sweep.Other, "error", err)
		return
	}
	if sweep.Moved > 0 || len(sweep.Unpinned) > 0 {
		log.Info("taps run the daemon's program", "program", datapath.ProgramName(), "taps", sweep.Links, "moved", sweep.Moved,
			"rows_copied", sweep.Copied, "unpinned", sweep.Unpinned)
	}
}

// collectRecords removes the CNI records that no longer speak for a tap
// (cnitap.CollectRecords).
func collectRecords(ctx context.Context, dataDir string, links cnitap.Links, locks teardown.Locker, log *slog.Logger) {
	log = log.With("component", "cni-records")
	res, err := cnitap.CollectRecords(ctx, dataDir, links, locks, 10*time.Second, log)
	if err != nil && ctx.Err() == nil {
		log.Warn("collecting CNI records: some were left for the next round", "folder", dataDir, "collected", len(res.Collected), "error", err)
	}
}

// passSignal passes the reclaim's reports on and says, without blocking
// the pass, that one ended.
type passSignal struct {
	reclaim.Observer
	done chan<- struct{}
}

func (p passSignal) PassDone(rep reclaim.Report, pending int) {
	p.Observer.PassDone(rep, pending)
	select {
	case p.done <- struct{}{}:
	default:
	}
}

// daemonGCPercent is the daemon's garbage-collection target: the heap may
// grow by 40% of what is live before a collection, not Go's default 100%.
// A node agent's live heap is a few MiB and its CPU mostly idle, so the
// extra collections cost little, while at 100% its resident memory is
// twice what it holds: 5,000 cluster objects a tenant made cost the daemon
// 7 to 10 MiB of RSS at 100%, 4 to 5 MiB at 40% (integration's
// TestManyMalformedObjectsCostEveryNodeABoundedAmount). Calico's Felix, a
// node agent of the same kind, defaults to the same 40 (GoGCThreshold).
const daemonGCPercent = 40

// setGCPercent sets daemonGCPercent unless GOGC in environ sets the
// target (or turns collection off), as the Go runtime reads it; it returns
// the target in force.
func setGCPercent(environ []string) string {
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, "GOGC="); ok && v != "" {
			return v + " (GOGC)"
		}
	}
	debug.SetGCPercent(daemonGCPercent)
	return strconv.Itoa(daemonGCPercent)
}
