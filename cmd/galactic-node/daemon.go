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
	"slices"
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
	"github.com/datum-cloud/galactic-node/node/nodeevents"
	"github.com/datum-cloud/galactic-node/node/nodeview"
	"github.com/datum-cloud/galactic-node/node/reclaim"
	"github.com/datum-cloud/galactic-node/node/reclaim/brakefile"
	"github.com/datum-cloud/galactic-node/node/reclaim/reclaimmetrics"
	"github.com/datum-cloud/galactic-node/node/routewatch"
	"github.com/datum-cloud/galactic-node/node/teardown"
	"github.com/datum-cloud/galactic-node/node/tun/holder"
	"github.com/datum-cloud/galactic-node/node/vrf"
)

type daemonFlags struct {
	nodeName, kubeconfig, inventoryFile   string
	inventoryMode                         string
	interval, minCandidateAge             time.Duration
	inventoryMaxAge, proofTimeout         time.Duration
	dryRun                                bool
	maxReclaims, massRemovalMin           int
	massRemovalShare, shrinkShare         float64
	shrinkWindow, brakeReleaseAfter       time.Duration
	largeInventory                        int
	brakeMemory                           string
	events                                bool
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
	fs.StringVar(&f.inventoryMode, "inventory", inventoryCandidates, "how the cluster's inventory is read: candidates (ask the API server about the unheld taps' identities only, with consistent reads; no watch, no cache; needs the CRDs' selectableFields and one-spelling admission of deploy/crds or deploy/admission) or informers (watch every VPCAttachment and BGPAdvertisement of the cluster, for CRDs another system owns)")
	fs.DurationVar(&f.interval, "interval", time.Minute, "time between passes; 0 runs passes only when forced")
	fs.DurationVar(&f.minCandidateAge, "min-candidate-age", 5*time.Minute, "how long a tap must have been seen stale before a pass may remove it, on top of two passes; 0 only for labs and tests")
	fs.DurationVar(&f.inventoryMaxAge, "inventory-max-age", 5*time.Minute, "readiness fails when the newest consistent read of the API server that succeeded started longer ago than this (watch events do not count: they may arrive late); the daemon probes with one every quarter of this (at least every 1s; every 75s with 0), so an API server or link d behind keeps the age at d or more; 0 disables")
	fs.DurationVar(&f.proofTimeout, "inventory-proof-timeout", 10*time.Second, "bound on each request (each page of 5000 objects, each probe) of the consistent reads of the API server; the read that must precede every removal has as many pages as there are objects")
	fs.BoolVar(&f.dryRun, "dry-run", false, "compute and report every pass, remove nothing")
	fs.IntVar(&f.maxReclaims, "max-reclaims-per-pass", reclaim.DefaultMaxReclaimsPerPass, "cap on removals per pass, the rest roll over (0: no cap)")
	fs.Float64Var(&f.massRemovalShare, "mass-removal-share", reclaim.DefaultMassRemovalShare, "the brake engages, and passes remove nothing, when the taps found stale at once (confirmed, or awaiting confirmation) are more than this share of the node's stamped taps and at least --mass-removal-min (1 turns this rule off)")
	fs.IntVar(&f.massRemovalMin, "mass-removal-min", reclaim.DefaultMassRemovalMin, "fewest taps found stale at once, or identities gone from the inventory, that may engage the brake")
	fs.Float64Var(&f.shrinkShare, "inventory-shrink-share", reclaim.DefaultInventoryShrinkShare, "the brake engages when the identities the cluster carries fell by more than this share of their peak within --inventory-shrink-window while a pass has taps to remove (1 turns this rule off)")
	fs.DurationVar(&f.shrinkWindow, "inventory-shrink-window", reclaim.DefaultShrinkWindow, "how far back the inventory's peak is looked for")
	fs.DurationVar(&f.brakeReleaseAfter, "mass-removal-release-after", reclaim.DefaultBrakeReleaseAfter, "an engaged brake releases on its own once the inventory has shrunk no further for this long (0: only galactic-node pass --allow-mass-removal releases it)")
	fs.IntVar(&f.largeInventory, "large-inventory-threshold", reclaim.DefaultLargeInventory, "identities at the inventory's peak from which the shrink rule holds any removal; below it, a cluster is small and the rule holds only --mass-removal-min taps or more at once (the node lifecycle controller's --large-cluster-size-threshold)")
	fs.StringVar(&f.brakeMemory, "brake-memory", brakefile.DefaultPath, "file keeping the mass-removal brake's state (engaged, why, since, the inventory's peak, what a release accepted) across restarts; an unreadable one is moved aside and the brake starts engaged (empty: kept in the daemon only, released by a restart)")
	fs.BoolVar(&f.events, "events", true, "record Kubernetes Events about this node (a tap reclaimed or not, the mass-removal brake); needs a cluster")
	fs.StringVar(&f.bpffs, "bpffs", defaultBPFFS, "bpf filesystem; maps are pinned under <bpffs>/galactic")
	fs.StringVar(&f.layoutRecord, "layout-record", datapath.DefaultLayoutRecord, "where to record the pinned maps' layout once opened, which install-cni checks a new plugin against (empty: none)")
	fs.StringVar(&f.vrfLockDir, "vrf-lock-dir", vrf.DefaultDir, "folder of the per-VRF lock files shared with the CNI plugin")
	fs.StringVar(&f.cniCacheDirs, "cni-cache-dirs", strings.Join(cnicache.DefaultDirs(), ","),
		"libcni's cache folders (the runtime's, Multus'), comma-separated: a tap an older build made is bound to the MAC and addresses its cached ADD gave it (empty: taps of older builds stay unbound until their next ADD)")
	fs.StringVar(&f.cniDataDir, "cni-data-dir", cnitap.DefaultDataDir, "the CNI plugin's records; each interval the daemon removes those whose tap is gone, which a removed network's GC never would (empty disables)")
	fs.StringVar(&f.adminSocket, "admin-socket", defaultAdminSocket, "admin API unix socket, mode 0600, in a folder only its owner may write (empty disables)")
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
	if f.inventoryMode != inventoryCandidates && f.inventoryMode != inventoryInformers {
		return nil, fmt.Errorf("--inventory %q: want %s or %s", f.inventoryMode, inventoryCandidates, inventoryInformers)
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
	if f.largeInventory < 0 {
		return nil, errors.New("--large-inventory-threshold must not be negative (0: every cluster is large)")
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

// daemon is the node daemon's parts. runDaemon builds them in the order
// of its list, each in one step, and each step that starts something says
// in the same place how it stops (d.stops, run in reverse on the way out).
// docs/operations.md's restart table lists what each part keeps across a
// restart.
type daemon struct {
	f   *daemonFlags
	log *slog.Logger

	conn      *link.Conn
	dp        *datapath.Datapath
	registry  *attachreg.Registry
	routes    *routewatch.Watcher
	locks     *vrf.Locker
	cluster   *rest.Config // nil with --inventory-file and no delegated auth
	inv       inventory.Source
	reg       *prometheus.Registry
	metrics   *reclaimmetrics.Metrics
	events    *nodeevents.Recorder // nil without a cluster or with --events=false
	reclaimer *reclaim.Reclaimer
	views     *nodeview.Views
	records   *recordCollector // nil with --cni-data-dir=
	// passDone says, without blocking a pass, that one ended: the record
	// collection and the move to the current program follow each.
	passDone chan struct{}
	live     func(context.Context) error
	servers  []*http.Server
	stops    []func()
	// stopBy bounds the whole shutdown: the pass in flight, then the
	// servers (a forced pass answering its caller) share one deadline.
	stopBy time.Time
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
	if known, err := refuseHostDefaultsOffHost(f); err != nil {
		return cli.Misuse("galactic-node run", err)
	} else if !known {
		log.Warn("cannot tell whether this network namespace is the host's (/proc/1/ns/net unreadable): the default host paths are not checked")
	}
	klogroute.Into(log)
	log.Info("galactic-node starting", "version", buildinfo.Version(version), "interval", f.interval, "min_candidate_age", f.minCandidateAge, "dry_run", f.dryRun,
		"max_reclaims_per_pass", f.maxReclaims, "bpffs", f.bpffs, "inventory_file", f.inventoryFile, "inventory", f.inventoryMode, "gc_percent", setGCPercent(environ),
		"brake_memory", f.brakeMemory, "cni_data_dir", f.cniDataDir)

	d := &daemon{f: f, log: log, passDone: make(chan struct{}, 1)}
	defer d.stop(ctx)
	for _, step := range []func(context.Context) error{
		d.openLinks,     // rtnetlink in the daemon's namespace
		d.openDatapath,  // pinned maps and program, the layout record, the registry
		d.moveTaps,      // taps of an earlier build onto this build's program
		d.watchRoutes,   // subscribed before anything runs
		d.openLocks,     // the VRF locks shared with the CNI plugin
		d.openInventory, // the cluster's objects, or a file
		d.openMetrics,   // the registry every part registers on
		d.openEvents,    // Kubernetes Events about the node
		d.openReclaim,   // the reclaim, with the brake's memory
		d.openRecords,   // the CNI records' collection
		d.openViews,     // what the admin API and the metrics read
		d.serveAdmin,    // the admin API
		d.serveMetrics,  // metrics and probes
	} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return d.run(ctx)
}

// stop stops what the steps started, newest first, within the shutdown
// bound.
func (d *daemon) stop(ctx context.Context) {
	if d.stopBy.IsZero() {
		d.stopBy = time.Now().Add(d.f.shutdownTimeout)
	}
	shutdownCtx, cancel := context.WithDeadline(context.WithoutCancel(ctx), d.stopBy)
	defer cancel()
	for _, s := range d.servers {
		_ = s.Shutdown(shutdownCtx)
	}
	for _, stop := range slices.Backward(d.stops) {
		stop()
	}
}

func (d *daemon) openLinks(context.Context) error {
	conn, err := link.Dial(nil)
	if err != nil {
		return err
	}
	d.conn = conn
	d.stops = append(d.stops, func() { conn.Close() })
	return nil
}

func (d *daemon) openDatapath(ctx context.Context) error {
	dp, err := datapath.Load(d.f.bpffs)
	if err != nil {
		return err
	}
	d.dp = dp
	d.stops = append(d.stops, func() { dp.Close() })
	if m := dp.Migrated(); len(m) > 0 {
		d.log.Info("pinned maps of another capacity migrated: rows copied into maps of this build's, pins swapped", "maps", m)
	}
	if err := dp.AdoptProgram(); err != nil {
		return err
	}
	if d.f.layoutRecord != "" {
		if err := datapath.RecordLayout(d.f.layoutRecord); err != nil {
			return err
		}
	}
	d.registry = attachreg.New(dp, nil, d.log)
	if d.f.cniDataDir != "" && d.f.cniCacheDirs != "" {
		conn := d.conn
		d.registry.Bindings = cnicache.Binder{DataDir: d.f.cniDataDir, CacheDirs: strings.Split(d.f.cniCacheDirs, ","),
			Owner: func(ifindex uint32) (string, string, error) {
				l, err := conn.Get(ctx, ifindex)
				return l.Name, l.Alias, err
			}}
	}
	return nil
}

// moveTaps: taps attached by an earlier build run its rules until moved,
// before anything else, and after every pass (run).
func (d *daemon) moveTaps(ctx context.Context) error {
	moveToCurrentProgram(ctx, d.registry, d.log)
	return nil
}

// watchRoutes subscribes before anything runs, so that no change made
// after the program's first cached answer goes unread.
func (d *daemon) watchRoutes(context.Context) error {
	routes, err := routewatch.Dial(nil, d.dp, d.log.With("component", "route-watch"))
	if err != nil {
		return err
	}
	d.routes = routes
	d.stops = append(d.stops, func() { _ = routes.Close() })
	return nil
}

func (d *daemon) openLocks(context.Context) error {
	locks, err := vrf.NewLocker(d.f.vrfLockDir)
	d.locks = locks
	return err
}

func (d *daemon) openInventory(ctx context.Context) error {
	f := d.f
	if f.inventoryFile == "" || f.adminKubeAuth {
		cfg, err := kubeConfig(f.kubeconfig)
		if err != nil {
			return err
		}
		d.cluster = cfg
	}
	if f.inventoryFile != "" {
		d.inv = inventory.NewFile(f.inventoryFile)
		return nil
	}
	opts := kubeinventory.Options{PageTimeout: f.proofTimeout, ProbeInterval: probeInterval(f.inventoryMaxAge)}
	if f.inventoryMode == inventoryInformers {
		d.log.Info("inventory: informers", "why", "--inventory=informers: every VPCAttachment and BGPAdvertisement of the cluster watched and cached, each removal proven by a consistent read of them all")
		ci, err := kubeinventory.NewCluster(d.cluster, d.log, opts)
		if err != nil {
			return err
		}
		ci.Start(ctx)
		d.inv = ci
		return nil
	}
	d.log.Info("inventory: candidates", "why", "the default: no watch and no cache; each pass asks the API server, consistently, about the identities of its unheld taps only",
		"needs", "selectableFields status.vpc and status.vpcAttachment on the VPCAttachment CRD, and one spelling of each identity (deploy/crds or deploy/admission); without them every pass fails to ask and removes nothing: run --inventory=informers")
	ca, err := kubeinventory.NewCandidates(d.cluster, d.log, opts)
	if err != nil {
		return err
	}
	ca.Start(ctx)
	d.inv = ca
	return nil
}

// Inventory modes (--inventory).
const (
	inventoryCandidates = "candidates"
	inventoryInformers  = "informers"
)

func (d *daemon) openMetrics(context.Context) error {
	d.reg = prometheus.NewRegistry()
	d.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildmetric.Collector(buildinfo.Version(version)))
	metrics, err := reclaimmetrics.NewMetrics(d.reg)
	if err != nil {
		return err
	}
	d.metrics = metrics
	metrics.SetConfig(d.f.dryRun, d.f.interval)
	if p, ok := d.inv.(inventory.Proven); ok {
		if err := reclaimmetrics.RegisterInventoryAge(d.reg, p); err != nil {
			return err
		}
	}
	return nil
}

// openEvents records the reclaim's Events about the node where there is a
// cluster to record them in. A client of its own, so that events never
// queue behind the inventory's reads; tools/events writes them in the
// background and drops what the API server does not take.
func (d *daemon) openEvents(ctx context.Context) error {
	if !d.f.events || d.cluster == nil {
		d.log.Info("no Kubernetes Events: the reclaim's actions are in this log, the metrics and the admin API only",
			"why", map[bool]string{true: "no cluster (--inventory-file)", false: "--events=false"}[d.f.events])
		return nil
	}
	cfg := rest.CopyConfig(d.cluster)
	cfg.Timeout = 10 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("events client: %w", err)
	}
	rec, err := nodeevents.New(ctx, cs, d.f.nodeName)
	if err != nil {
		return err
	}
	d.events = rec
	d.stops = append(d.stops, rec.Shutdown)
	return nil
}

func (d *daemon) openReclaim(ctx context.Context) error {
	breakFlags(d.f, d.log)
	f := d.f
	// The kernel probe decides whether a tap is free; without the tun
	// device every removal fails at stage probe, which the failures metric
	// and its alert show, while the maps the CNI plugin needs stay served.
	if err := holder.CanProbe(); err != nil {
		d.log.Error("no tap can be reclaimed: the kernel probe cannot open the tun device (mount the host's /dev/net/tun)", "error", err)
	}
	rcfg := reclaim.Config{DryRun: f.dryRun, MaxReclaimsPerPass: f.maxReclaims, MinCandidateAge: f.minCandidateAge,
		MassRemovalShare: f.massRemovalShare, MassRemovalMin: f.massRemovalMin, InventoryShrinkShare: f.shrinkShare,
		ShrinkWindow: f.shrinkWindow, BrakeReleaseAfter: f.brakeReleaseAfter, LargeInventory: f.largeInventory,
		Prober: holder.Prober{Links: d.conn}}
	// The flags say 0 for "none"; the reclaim's zero values are defaults.
	if f.maxReclaims == 0 {
		rcfg.MaxReclaimsPerPass = -1
	}
	if f.brakeReleaseAfter == 0 {
		rcfg.BrakeReleaseAfter = -1
	}
	if f.largeInventory == 0 {
		rcfg.LargeInventory = -1
	}
	var memory *brakefile.File
	if f.brakeMemory != "" {
		memory = &brakefile.File{Path: f.brakeMemory}
		rcfg.Memory = memory
	}
	if d.events != nil {
		rcfg.Events = d.events
	}
	links, inv, reg := reclaimInputs(d.conn, d.inv, d.registry, &rcfg, d.log)
	d.reclaimer = reclaim.New(links, inv, reg, d.locks, passSignal{d.metrics, d.passDone}, d.log, rcfg)
	if memory == nil {
		d.log.Warn("the brake's memory is kept in the daemon only (--brake-memory=): a restart releases an engaged brake")
		return nil
	}
	m, err := memory.Load()
	switch {
	case errors.Is(err, brakefile.ErrUnreadable):
		// Whether the brake held before cannot be told: it holds now.
		d.reclaimer.EngageBrake("the brake's memory could not be read at start, so whether it held before is unknown: " + err.Error())
	case err != nil:
		return err
	default:
		d.reclaimer.RestoreBrake(m)
	}
	b := d.reclaimer.Brake()
	d.metrics.SetBrake(b.Engaged, b.Held)
	return nil
}

func (d *daemon) openRecords(context.Context) error {
	if d.f.cniDataDir == "" {
		return nil
	}
	d.records = &recordCollector{dataDir: d.f.cniDataDir, links: d.conn, locks: d.locks, log: d.log.With("component", "cni-records")}
	return nil
}

func (d *daemon) openViews(context.Context) error {
	holders := holder.Proc{Root: "/proc"}
	if ok, why := holders.Scan(context.Background()).Complete(); !ok {
		d.log.Info("the holder scan cannot see every process: HOLDERS may miss some; removals do not depend on it", "why", why)
	}
	ag := &nodeview.Views{Links: d.conn, Inventory: d.inv, Reclaimer: d.reclaimer, Registry: d.registry, Datapath: d.dp, Holders: holders,
		MaxInventoryAge: d.f.inventoryMaxAge, Counters: d.dp, Prober: holder.Prober{Links: d.conn}}
	if d.records != nil {
		ag.Records = d.records
	}
	// The drop monitor reads the program's records of dropped frames
	// whether or not anyone follows them, so that the ring never fills
	// while nobody looks; a kernel without ring buffers leaves the node
	// without it, and says so (/v1/drops, the metrics).
	if mon, err := d.dp.OpenDropMonitor(); err != nil {
		ag.DropsUnavailable = err.Error()
		d.log.Warn("no drop monitor: galactic-node drops will have no records", "error", err)
	} else {
		ag.Drops = dropwatch.New(dropwatch.Config{Source: newDropSource(mon, d.conn), Log: d.log.With("component", "drop-monitor")})
	}
	if err := d.reg.Register(ag.MapCollector()); err != nil {
		return err
	}
	if err := d.reg.Register(ag.DecisionCollector()); err != nil {
		return err
	}
	d.views = ag
	// live is the liveness probe, on the metrics port and the admin API.
	d.live = func(context.Context) error {
		err := d.reclaimer.Stuck(time.Now(), d.f.passStuckAfter)
		if err != nil {
			d.log.Error("liveness fails", "error", err)
		}
		return err
	}
	return nil
}

// serve bounds l's connections, counts them on the metrics, and serves s
// on it until stop.
func (d *daemon) serve(s *http.Server, l *connlimit.Listener, what string) {
	d.reg.MustRegister(l.Collectors(what)...)
	d.servers = append(d.servers, s)
	var ln net.Listener = l
	if s.TLSConfig != nil {
		// TLS inside the bound: a handshake costs a slot, never more.
		ln = tls.NewListener(l, s.TLSConfig)
	}
	go func() {
		if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("server stopped", "server", what, "error", err)
		}
	}()
}

func (d *daemon) serveAdmin(ctx context.Context) error {
	f, log := d.f, d.log
	if f.adminSocket == "" && f.adminListen == "" {
		return nil
	}
	if f.adminForcesPerMinute == 0 {
		log.Info("forced passes are disabled (--admin-forces-per-minute 0)")
	}
	acfg := admin.Config{ForcesPerMinute: f.adminForcesPerMinute, Log: log, Version: buildinfo.Version(version), Node: f.nodeName, Peers: &admin.PeerPolicy{}, Live: d.live}
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
		kcfg := rest.CopyConfig(d.cluster)
		kcfg.Timeout = 2 * kubeauth.ReviewTimeout
		cs, err := kubernetes.NewForConfig(kcfg)
		if err != nil {
			return fmt.Errorf("delegated auth client: %w", err)
		}
		acfg.Kube = kubeauth.New(cs, f.nodeName)
	}
	h := admin.NewHandler(admin.BackendOf(d.views), acfg)
	if f.adminSocket != "" {
		l, err := admin.ListenUnix(f.adminSocket, acfg.Peers.ReadGroup)
		if err != nil {
			return err
		}
		d.serve(admin.NewServer(h, log), admin.LimitAdmin(l, "admin-socket", log), "admin-socket")
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
		d.serve(s, admin.LimitAdmin(l, "admin-tcp", log), "admin-tcp")
		log.Info("admin API listening", "address", l.Addr().String(), "tls", f.adminTLSCert != "")
	}
	return nil
}

func (d *daemon) serveMetrics(context.Context) error {
	if d.f.metricsListen == "" {
		return nil
	}
	l, err := net.Listen("tcp", d.f.metricsListen)
	if err != nil {
		return fmt.Errorf("metrics listen %s: %w", d.f.metricsListen, err)
	}
	h := metricsserve.Handler(d.reg, d.live, d.views.Ready)
	d.serve(metricsserve.NewServer(h, d.log), metricsserve.Limit(l, "metrics", d.log), "metrics")
	d.log.Info("metrics listening", "address", l.Addr().String())
	return nil
}

// run runs the loops until ctx ends or one fails, then finishes the pass
// in flight within the shutdown bound.
func (d *daemon) run(ctx context.Context) error {
	log := d.log
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var wg sync.WaitGroup
	wg.Go(func() {
		// Without it the program's route answers go stale for 64 jiffies
		// after a change, so a watcher that fails stops the daemon, to be
		// restarted, rather than run on with the window open.
		if err := d.routes.Run(ctx); err != nil {
			log.Error("route watch failed: stopping", "error", err)
			stop(err)
		}
	})
	wg.Go(func() { d.reclaimer.Run(ctx, d.f.interval) })
	if d.views.Drops != nil {
		wg.Go(func() {
			if err := d.views.Drops.Run(ctx); err != nil {
				log.Error("drop monitor stopped", "error", err)
			}
		})
	}
	wg.Go(func() {
		// The move ran at start, before the servers; the records are
		// collected at start here. Each pass may remove taps whose
		// records then name nothing: the collection runs after it.
		if d.records != nil {
			d.records.collect(ctx)
		}
		afterEachPass(ctx, d.passDone, func() {
			moveToCurrentProgram(ctx, d.registry, log)
			if d.records != nil {
				d.records.collect(ctx)
			}
		})
	})
	<-ctx.Done()
	d.stopBy = time.Now().Add(d.f.shutdownTimeout)
	log.Info("stopping: finishing the pass in flight", "timeout", d.f.shutdownTimeout.String())
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		log.Info("stopped")
	case <-time.After(time.Until(d.stopBy)):
		// Exiting mid-removal is safe: a link deleted before its rows
		// leaves orphan rows, which the next start's passes clear.
		log.Warn("stopping with a pass still in flight: the shutdown timeout ran out", "timeout", d.f.shutdownTimeout.String())
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

// recordCollector removes the CNI records that no longer speak for a tap
// (cnitap.CollectRecords), and keeps what its last round said for
// /v1/status.
type recordCollector struct {
	dataDir string
	links   cnitap.Links
	locks   teardown.Locker
	log     *slog.Logger

	mu   sync.Mutex
	last nodeview.RecordsStatus
}

func (c *recordCollector) collect(ctx context.Context) {
	res, err := cnitap.CollectRecords(ctx, c.dataDir, c.links, c.locks, 10*time.Second, c.log)
	if err != nil && ctx.Err() == nil {
		c.log.Warn("collecting CNI records: some were left for the next round", "folder", c.dataDir, "collected", len(res.Collected), "error", err)
	}
	st := nodeview.RecordsStatus{Folder: c.dataDir, At: time.Now(), Collected: len(res.Collected), Kept: res.Unjudged, KeptWhy: res.UnjudgedWhy}
	if err != nil {
		st.Error = err.Error()
	}
	c.mu.Lock()
	c.last = st
	c.mu.Unlock()
}

// RecordsStatus implements nodeview.RecordsSource.
func (c *recordCollector) RecordsStatus() nodeview.RecordsStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
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
