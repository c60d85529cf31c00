package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/datum-cloud/galactic-node/internal/logging/klogroute"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
	"github.com/datum-cloud/galactic-node/test/framework/syncbuf"
)

// TestMain routes klog once, before any test runs runEnv (which would route
// it again) while its own client-go calls read it.
func TestMain(m *testing.M) {
	klogroute.Into(slog.New(slog.DiscardHandler))
	os.Exit(clustertest.Main(m))
}

func env(kv map[string]string) []string {
	var environ []string
	for k, v := range kv {
		environ = append(environ, k+"="+v)
	}
	return environ
}

// Bad values are refused before anything connects, naming the flag or the
// variable that carried them.
func TestBadFlagsAndEnvironmentAreRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, map[string]string{"GALACTIC_KUBE_API_QPS": "fast"}, "GALACTIC_KUBE_API_QPS"},
		{[]string{"--kube-api-burst=0"}, nil, "--kube-api-burst"},
		{[]string{"--placement=argo"}, nil, "want karmada or none"},
		{nil, map[string]string{"GALACTIC_PLACEMENT": "Karmada"}, "want karmada or none"},
		{[]string{"--leader-elect-lease-duration=2s", "--leader-elect-renew-deadline=2s", "--leader-elect-retry-period=1s"}, nil, "--leader-elect-lease-duration"},
		{[]string{"--leader-elect-renew-deadline=1s", "--leader-elect-retry-period=1s"}, nil, "--leader-elect-renew-deadline"},
		{nil, map[string]string{"GALACTIC_LEADER_ELECT_RETRY_PERIOD": "0s"}, "--leader-elect-retry-period"},
		// client-go takes it, but the write fence would never open: the
		// Lease records 1 s, less the fence's 1 s margin.
		{[]string{"--leader-elect-lease-duration=1900ms", "--leader-elect-renew-deadline=1500ms", "--leader-elect-retry-period=500ms"}, nil, "or a leader renewing on time could not write"},
		// Open 2 s of every 3 s between renewals.
		{[]string{"--leader-elect-lease-duration=5s", "--leader-elect-renew-deadline=4s", "--leader-elect-retry-period=3s"}, nil, "or a leader renewing on time could not write"},
	} {
		args := append([]string{"--platform-namespace=p", "--kubeconfig=/nonexistent"}, tc.args...)
		err := runEnv(context.Background(), args, env(tc.env), &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: %v, want an error naming %s", tc.args, tc.env, err, tc.want)
		}
	}
}

// The command against a real API server takes its client rate and its
// lease timing from GALACTIC_* and the flags, the command line winning:
// the Lease it holds records the lease duration it was given.
func TestTheClientRateAndLeaseTimingReachTheAPIServer(t *testing.T) {
	cluster := clustertest.Shared(t)
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	ns := fmt.Sprintf("platform-cmd-%d", time.Now().UnixNano()%1e9)
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeconfig := writeKubeconfig(t, cluster)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr syncbuf.Buffer
	done := make(chan error, 1)
	go func() {
		done <- runEnv(ctx, []string{"--kubeconfig=" + kubeconfig, "--listen=", "--id=one", "--kube-api-burst=40",
			"--leader-elect-lease-duration=7s"},
			env(map[string]string{
				"GALACTIC_PLATFORM_NAMESPACE":          ns,
				"GALACTIC_KUBE_API_QPS":                "30",
				"GALACTIC_KUBE_API_BURST":              "999", // the flag wins
				"GALACTIC_LEADER_ELECT_LEASE_DURATION": "99s", // the flag wins
				"GALACTIC_LEADER_ELECT_RENEW_DEADLINE": "5s",
				"GALACTIC_LEADER_ELECT_RETRY_PERIOD":   "300ms",
			}), &bytes.Buffer{}, &stderr)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err := cs.CoordinationV1().Leases(ns).Get(context.Background(), "galactic-hubctl", metav1.GetOptions{})
		if err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == "one" {
			if d := l.Spec.LeaseDurationSeconds; d == nil || *d != 7 {
				t.Fatalf("Lease duration %v s, want 7", d)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no Lease held by one; log:\n%s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	log := stderr.String()
	for _, want := range []string{`"kube_api_qps":30`, `"kube_api_burst":40`, `"renew_deadline":"5s"`, `"retry_period":"300ms"`} {
		if !strings.Contains(log, want) {
			t.Errorf("the startup log lacks %s:\n%s", want, log)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run after a stop: %v", err)
	}
}

func writeKubeconfig(t *testing.T, cluster *clustertest.Cluster) string {
	t.Helper()
	c := cluster.Config
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: c.Host, CertificateAuthorityData: c.CAData}
	cfg.AuthInfos["test"] = &clientcmdapi.AuthInfo{ClientCertificateData: c.CertData, ClientKeyData: c.KeyData, Token: c.BearerToken}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	cfg.CurrentContext = "test"
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, p); err != nil {
		t.Fatal(err)
	}
	return p
}
