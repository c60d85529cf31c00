package envflag

import (
	"flag"
	"strings"
	"testing"
	"time"
)

func flags() *flag.FlagSet {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.Duration("interval", time.Minute, "")
	fs.String("log-format", "json", "")
	return fs
}

func TestTheCommandLineWinsOverTheEnvironment(t *testing.T) {
	fs := flags()
	if err := fs.Parse([]string{"--log-format=text"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"GALACTIC_INTERVAL": "5m", "GALACTIC_LOG_FORMAT": "json"}
	if err := Set(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatal(err)
	}
	if got := fs.Lookup("interval").Value.String(); got != "5m0s" {
		t.Errorf("interval %s, want 5m0s from the environment", got)
	}
	if got := fs.Lookup("log-format").Value.String(); got != "text" {
		t.Errorf("log-format %s, want text from the command line", got)
	}
}

func TestUnknownVariablesAreNamedWithTheirLikelyFlag(t *testing.T) {
	other := flag.NewFlagSet("other", flag.ContinueOnError)
	other.String("cni-bin-dir", "", "")
	known := Names(flags(), other)
	for _, tc := range []struct {
		env  []string
		want string // empty: no error
	}{
		{[]string{"GALACTIC_INTERVAL=1m", "GALACTIC_CNI_BIN_DIR=/x", "PATH=/bin", "GALACTICTEST_SKIP_PRIVILEGED=1"}, ""},
		{[]string{"GALACTIC_INTERVALL=1m"}, "GALACTIC_INTERVALL (did you mean GALACTIC_INTERVAL?)"},
		{[]string{"GALACTIC_FOO=1"}, "unknown environment variable GALACTIC_FOO"},
		{[]string{"GALACTIC_LOG_FROMAT=text", "GALACTIC_ZZZ="}, "GALACTIC_LOG_FROMAT (did you mean GALACTIC_LOG_FORMAT?), GALACTIC_ZZZ"},
	} {
		err := Unknown(tc.env, known)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v", tc.env, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: %v, want %q", tc.env, err, tc.want)
		}
	}
	if err := Unknown([]string{"GALACTIC_FOO=1"}, known); strings.Contains(err.Error(), "did you mean") {
		t.Errorf("GALACTIC_FOO has no obvious flag, yet: %v", err)
	}
}

// kubeletServiceLinks is what the kubelet puts into every container of a
// pod in galactic-system without enableServiceLinks: false, for the
// project's own two metrics Services (pkg/kubelet/envvars).
var kubeletServiceLinks = []string{
	"GALACTIC_HUBCTL_METRICS_SERVICE_HOST=10.96.12.34",
	"GALACTIC_HUBCTL_METRICS_SERVICE_PORT=9181",
	"GALACTIC_HUBCTL_METRICS_SERVICE_PORT_METRICS=9181",
	"GALACTIC_HUBCTL_METRICS_PORT=tcp://10.96.12.34:9181",
	"GALACTIC_HUBCTL_METRICS_PORT_9181_TCP=tcp://10.96.12.34:9181",
	"GALACTIC_HUBCTL_METRICS_PORT_9181_TCP_PROTO=tcp",
	"GALACTIC_HUBCTL_METRICS_PORT_9181_TCP_PORT=9181",
	"GALACTIC_HUBCTL_METRICS_PORT_9181_TCP_ADDR=10.96.12.34",
	"GALACTIC_NODE_METRICS_SERVICE_HOST=10.96.0.80",
	"GALACTIC_NODE_METRICS_SERVICE_PORT=9180",
	"GALACTIC_NODE_METRICS_PORT=tcp://10.96.0.80:9180",
	"GALACTIC_NODE_METRICS_PORT_9180_TCP=tcp://10.96.0.80:9180",
	"GALACTIC_NODE_METRICS_PORT_9180_UDP_PROTO=udp",
}

// The variables a kubelet injects for Services are nobody's mistake: a
// pod must not crash-loop because a Service named galactic-… exists
// beside it. A variable merely ending in _PORT is still judged, by its
// value.
func TestKubeletServiceLinksAreNotMistakes(t *testing.T) {
	known := Names(flags())
	if err := Unknown(kubeletServiceLinks, known); err != nil {
		t.Fatalf("the kubelet's service links: %v", err)
	}
	for _, kv := range []string{"GALACTIC_METRICS_PORT=9180", "GALACTIC_SERVICE_HOSTS=x", "GALACTIC_PORT_80_TCPX=x"} {
		if err := Unknown([]string{kv}, known); err == nil {
			t.Errorf("%s is no service link, yet it was ignored", kv)
		}
	}
}
