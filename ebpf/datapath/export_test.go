package datapath

import "github.com/cilium/ebpf"

// StateMapsForTest are the loaded program's state maps, for benchmarks
// that run another object of the program on the same state.
func (d *Datapath) StateMapsForTest() map[string]*ebpf.Map {
	m := &d.objs.datapathMaps
	return map[string]*ebpf.Map{
		"route_cache": m.RouteCache, "route_epoch": m.RouteEpoch, "host_filter": m.HostFilter, "host_view": m.HostView,
		"decision_totals": m.DecisionTotals, "drop_records": m.DropRecords, "drop_budgets": m.DropBudgets,
		"drop_records_lost": m.DropRecordsLost, "rules_scratch": m.RulesScratch,
	}
}

// DropBudgetsForTest mirrors DROP_BUDGETS.
const DropBudgetsForTest = 8192
