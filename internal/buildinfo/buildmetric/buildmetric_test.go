package buildmetric

import (
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/datum-cloud/galactic-node/internal/buildinfo"
)

func TestTheGaugeIsOneWithItsLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(Collector("v9"))
	want := `# HELP galactic_build_info Always 1; the labels say which build this process runs.
# TYPE galactic_build_info gauge
galactic_build_info{goversion="` + runtime.Version() + `",revision="` + buildinfo.Revision() + `",version="v9"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "galactic_build_info"); err != nil {
		t.Error(err)
	}
}
