package integration

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/datum-cloud/galactic-node/hubctl"
	"github.com/datum-cloud/galactic-node/internal/connlimit"
	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/node/nodeview"
	"github.com/datum-cloud/galactic-node/node/reclaim/reclaimmetrics"
)

const (
	monitoringOverlay = "../deploy/overlays/monitoring"
	rulesFile         = "../deploy/alerts/galactic.rules.yaml"
	prometheusRule    = "../deploy/components/monitoring/prometheusrule.yaml"
	dashboardFile     = "../deploy/components/monitoring/dashboards/galactic.json"
)

// TestMonitoringComponentIsAcceptedByTheAPIServer dry-runs every object of
// the monitoring overlay against prometheus-operator's CRDs (clustertest
// installs them), and checks that each PodMonitor selects its workload's
// pods, on a port they declare, under the job name the alert rules use.
func TestMonitoringComponentIsAcceptedByTheAPIServer(t *testing.T) {
	a := newApplier(t)
	objs := build(t, monitoringOverlay)
	kinds := map[string][]*unstructured.Unstructured{}
	for _, obj := range objs {
		kinds[obj.GetKind()] = append(kinds[obj.GetKind()], obj)
		if err := a.apply(obj, true); err != nil {
			t.Errorf("%s %s/%s refused: %v", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
		}
	}
	if len(kinds["PodMonitor"]) != 2 || len(kinds["PrometheusRule"]) != 1 {
		t.Fatalf("want 2 PodMonitors and 1 PrometheusRule, built %d and %d", len(kinds["PodMonitor"]), len(kinds["PrometheusRule"]))
	}
	dashboard := false
	for _, cm := range kinds["ConfigMap"] {
		if cm.GetLabels()["grafana_dashboard"] == "1" {
			_, dashboard = cm.Object["data"].(map[string]any)["galactic.json"]
		}
	}
	if !dashboard {
		t.Error("no ConfigMap labelled grafana_dashboard=1 holds galactic.json")
	}
	workloads := map[string]*unstructured.Unstructured{}
	for _, k := range []string{"DaemonSet", "Deployment"} {
		for _, w := range kinds[k] {
			workloads[w.GetName()] = w
		}
	}
	for _, pm := range kinds["PodMonitor"] {
		job := pm.GetName() // the alert rules' job label
		w := workloads[job]
		if w == nil {
			t.Errorf("PodMonitor %s: no workload %s", job, job)
			continue
		}
		podLabels, _, _ := unstructured.NestedStringMap(w.Object, "spec", "template", "metadata", "labels")
		jobLabel, _, _ := unstructured.NestedString(pm.Object, "spec", "jobLabel")
		if podLabels[jobLabel] != job {
			t.Errorf("PodMonitor %s: jobLabel %q gives job %q, the alert rules expect %q", job, jobLabel, podLabels[jobLabel], job)
		}
		sel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
		for k, v := range sel {
			if podLabels[k] != v {
				t.Errorf("PodMonitor %s: selector %s=%s does not select the pods of %s", job, k, v, job)
			}
		}
		if pm.GetNamespace() != w.GetNamespace() {
			t.Errorf("PodMonitor %s in %s, its pods in %s", job, pm.GetNamespace(), w.GetNamespace())
		}
		containers, _, _ := unstructured.NestedSlice(w.Object, "spec", "template", "spec", "containers")
		flat, _ := json.Marshal(containers)
		endpoints, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
		for _, e := range endpoints {
			port := e.(map[string]any)["port"]
			if !strings.Contains(string(flat), `"name":"`+port.(string)+`"`) {
				t.Errorf("PodMonitor %s: port %v is not a port of %s's containers", job, port, job)
			}
		}
	}
}

// TestPrometheusRuleIsTheRuleFile fails when the PrometheusRule's spec and
// deploy/alerts/galactic.rules.yaml, the one source of the rules, differ.
func TestPrometheusRuleIsTheRuleFile(t *testing.T) {
	var rules, pr map[string]any
	for path, into := range map[string]*map[string]any{rulesFile: &rules, prometheusRule: &pr} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, into); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	if !reflect.DeepEqual(pr["spec"], rules) {
		t.Fatalf("%s differs from %s: run `make monitoring`", prometheusRule, rulesFile)
	}
	if len(rules["groups"].([]any)) == 0 {
		t.Fatal("no rule groups")
	}
}

// exported lists every metric name the binaries export, from their real
// collectors: the daemon's registry as cmd/galactic-node builds it and the
// hub's as cmd/galactic-hubctl does. Histograms and summaries add their
// series' suffixes.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	record := func(reg *prometheus.Registry, describeOnly ...prometheus.Collector) {
		ch := make(chan *prometheus.Desc, 1000)
		reg.Describe(ch)
		for _, c := range describeOnly {
			c.Describe(ch)
		}
		close(ch)
		fq := regexp.MustCompile(`fqName: "([^"]+)"`)
		for d := range ch {
			m := fq.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("no name in %s", d)
			}
			names[m[1]] = true
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			switch mf.GetType() {
			case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
				names[mf.GetName()+"_bucket"] = true
				fallthrough
			case dto.MetricType_SUMMARY:
				names[mf.GetName()+"_sum"], names[mf.GetName()+"_count"] = true, true
			}
		}
	}

	node := prometheus.NewRegistry()
	node.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if _, err := reclaimmetrics.NewMetrics(node); err != nil {
		t.Fatal(err)
	}
	if err := reclaimmetrics.RegisterInventoryAge(node, provenNow{}); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"admin", "metrics"} {
		node.MustRegister(connlimit.New(nil, connlimit.Limits{}, l, nil).Collectors(l)...)
	}
	// The map collector reads the pinned maps when collected: described only.
	record(node, (&nodeview.Views{}).MapCollector(), (&nodeview.Views{}).DecisionCollector())

	hub := prometheus.NewRegistry()
	hub.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if _, err := hubctl.NewMetrics(hub); err != nil {
		t.Fatal(err)
	}
	record(hub)
	return names
}

type provenNow struct{ *inventory.Static }

func (provenNow) Prove(context.Context) (inventory.Snapshot, error) { return inventory.Snapshot{}, nil }
func (provenNow) ProvenAt() time.Time                               { return time.Now() }

// metricNames parses expr as PromQL and returns the metric names it selects.
func metricNames(t *testing.T, expr string) ([]string, error) {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var out []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
					name = m.Value
				}
			}
			if name == "" {
				t.Errorf("%s: a selector without a metric name", expr)
			}
			out = append(out, name)
		}
		return nil
	})
	return out, nil
}

// grafanaVars are the dashboard's variables, replaced by values of their
// type so that its queries parse as the PromQL Grafana sends.
var grafanaVars = strings.NewReplacer("$__rate_interval", "2m", "$__interval", "1m", "$__range", "6h", "${node}", "node-1", "$node", "node-1")

// TestDashboardQueriesParseAndNameExportedMetrics parses every query of the
// Grafana dashboard as PromQL and checks that every metric it reads is one
// the binaries export (plus up, which Prometheus writes).
func TestDashboardQueriesParseAndNameExportedMetrics(t *testing.T) {
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string
		Type    string
		Targets []struct{ Expr string }
		Panels  []json.RawMessage
	}
	var dash struct {
		Panels []panel
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	have := exported(t)
	have["up"] = true
	used := map[string]bool{}
	queries := 0
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, q := range p.Targets {
				queries++
				names, err := metricNames(t, grafanaVars.Replace(q.Expr))
				if err != nil {
					t.Errorf("panel %q: %q does not parse: %v", p.Title, q.Expr, err)
					continue
				}
				for _, n := range names {
					used[n] = true
					if !have[n] {
						t.Errorf("panel %q reads %s, which no binary exports", p.Title, n)
					}
				}
			}
			var nested []panel
			for _, raw := range p.Panels {
				var np panel
				if err := json.Unmarshal(raw, &np); err != nil {
					t.Fatal(err)
				}
				nested = append(nested, np)
			}
			walk(nested)
		}
	}
	walk(dash.Panels)
	if queries < 20 {
		t.Fatalf("only %d queries in the dashboard", queries)
	}
	// What the issue asks the dashboard to show.
	for _, want := range []string{
		"galactic_cni_stale_taps_pending", "galactic_cni_stale_taps_reclaimed_total",
		"galactic_cni_stale_tap_reclaim_failures_total", "galactic_cni_stale_tap_pass_duration_seconds_bucket",
		"galactic_cni_stale_tap_last_completed_pass_timestamp_seconds", "galactic_cni_inventory_age_seconds",
		"galactic_ebpf_map_entries", "galactic_ebpf_decisions_overflow_total", "galactic_hub_claim_releases_total",
		"galactic_hub_claims_release_refused", "galactic_hub_claim_quota_refusals_total", "galactic_hub_unclaimed_blocks",
		"galactic_listener_connections",
	} {
		if !used[want] {
			t.Errorf("no panel shows %s", want)
		}
	}
}

// TestAlertRulesNameExportedMetrics checks that every metric an alert reads
// is one the binaries export; up and kube-state-metrics' kube_* come from
// elsewhere.
func TestAlertRulesNameExportedMetrics(t *testing.T) {
	groups, errs := rulefmt.ParseFile(rulesFile, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatalf("rules do not parse: %v", errs)
	}
	have := exported(t)
	var missing []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			names, err := metricNames(t, r.Expr)
			if err != nil {
				t.Fatalf("%s: %v", r.Alert, err)
			}
			for _, n := range names {
				if n != "up" && !strings.HasPrefix(n, "kube_") && !have[n] {
					missing = append(missing, r.Alert+": "+n)
				}
			}
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("alert reads a metric no binary exports: %s", m)
	}
}

// TestEveryAlertHasAFiringUnitTest: each alert of the rule file is expected
// to fire in at least one case of deploy/alerts/tests (run by promtool in
// make alert-test), so a new alert comes with its test.
func TestEveryAlertHasAFiringUnitTest(t *testing.T) {
	groups, errs := rulefmt.ParseFile(rulesFile, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatalf("rules do not parse: %v", errs)
	}
	data, err := os.ReadFile("../deploy/alerts/tests/galactic.rules_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(data, &tests); err != nil {
		t.Fatal(err)
	}
	fires := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			}
		}
	}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" && !fires[r.Alert] {
				t.Errorf("alert %s fires in no case of deploy/alerts/tests", r.Alert)
			}
		}
	}
}
