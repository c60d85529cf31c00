package reclaimmetrics

import (
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/datum-cloud/galactic-node/node/reclaim"
)

// galactic_cni_inventory_malformed_objects is labelled by kind only, both
// kinds always exported: however many malformed objects tenants make, and
// whatever they name them, it is two series.
func TestMalformedObjectsAreTwoSeriesOfCounts(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	want := func(att, adv int) string {
		return `
# HELP galactic_cni_inventory_malformed_objects ` + helpOf(t, reg) + `
# TYPE galactic_cni_inventory_malformed_objects gauge
galactic_cni_inventory_malformed_objects{kind="BGPAdvertisement"} ` + strconv.Itoa(adv) + `
galactic_cni_inventory_malformed_objects{kind="VPCAttachment"} ` + strconv.Itoa(att) + `
`
	}
	check := func(att, adv int) {
		t.Helper()
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want(att, adv)), "galactic_cni_inventory_malformed_objects"); err != nil {
			t.Error(err)
		}
	}
	check(0, 0) // before any pass
	m.Malformed(reclaim.MalformedCount{Attachments: 2500, Advertisements: 2500})
	check(2500, 2500)
	m.Malformed(reclaim.MalformedCount{Attachments: 3})
	check(3, 0) // a kind whose objects were fixed reads 0, not stale
	m.Malformed(reclaim.MalformedCount{})
	check(0, 0)
}

func helpOf(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "galactic_cni_inventory_malformed_objects" {
			return mf.GetHelp()
		}
	}
	t.Fatal("galactic_cni_inventory_malformed_objects is not exported")
	return ""
}
