// Package clustertest runs a real kube-apiserver and etcd for tests that read
// or write Kubernetes objects, with this project's CRDs installed (and
// prometheus-operator's PodMonitor, ServiceMonitor and PrometheusRule). The
// binaries are built from the Go module proxy by hack/testbin.sh (make test
// does it once per machine) and found through KUBEBUILDER_ASSETS.
//
// Without the binaries a test skips with a message saying how to build them,
// except under CI=true, where it fails.
package clustertest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"
)

// Cluster is a running API server.
type Cluster struct {
	Env    *envtest.Environment
	Config *rest.Config // cluster-admin
	Client dynamic.Interface
}

var (
	mu     sync.Mutex
	shared *Cluster
)

// Main runs a package's tests and stops the shared cluster afterwards; call
// it from TestMain.
func Main(m *testing.M) int {
	code := m.Run()
	mu.Lock()
	defer mu.Unlock()
	if shared != nil {
		_ = shared.Env.Stop()
	}
	return code
}

// Shared returns the package's cluster, starting it on first use.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if shared == nil {
		shared = Start(t)
	}
	return shared
}

// Start starts a cluster of its own; the caller stops it (Env.Stop), and
// may stop and start its API server (ControlPlane.APIServer) in between: its
// certificates and port survive a restart.
func Start(t testing.TB) *Cluster {
	t.Helper()
	return StartWith(t, nil)
}

// StartWith is Start with configure, when not nil, given the API server's
// flags before it starts (a test's --token-auth-file, say).
func StartWith(t testing.TB, configure func(*envtest.APIServer)) *Cluster {
	t.Helper()
	return start(t, configure, filepath.Join(repoRoot(), "deploy", "crds"))
}

// StartUnvalidated starts a cluster of its own (the caller stops it,
// Env.Stop) whose CRDs are deploy/crds with every x-kubernetes-validations
// rule stripped, and which has no ValidatingAdmissionPolicy: the cluster of
// an operator whose VPCAttachment and BGPAdvertisement CRDs are another
// system's. Tenants can create objects there that the node daemon cannot
// read (a status.vpc above 2^48-1, an advertisement named "a-b-c"), which is
// what tests of the daemon's tolerance, and of deploy/admission, need.
func StartUnvalidated(t testing.TB) *Cluster {
	t.Helper()
	dir, err := os.MkdirTemp("", "galactic-crds-unvalidated-")
	if err != nil {
		t.Fatalf("unvalidated CRDs: %v", err)
	}
	// The API server keeps installed CRDs in etcd, across restarts too, so
	// the copies are needed only until the cluster has started.
	defer os.RemoveAll(dir)
	if err := writeUnvalidatedCRDs(filepath.Join(repoRoot(), "deploy", "crds"), dir); err != nil {
		t.Fatalf("unvalidated CRDs: %v", err)
	}
	return start(t, nil, dir)
}

// writeUnvalidatedCRDs copies every CustomResourceDefinition in the YAML
// files of src to dst with x-kubernetes-validations removed at every depth;
// other documents (kustomization.yaml) are left out.
func writeUnvalidatedCRDs(src, dst string) error {
	files, err := filepath.Glob(filepath.Join(src, "*.yaml"))
	if err != nil {
		return fmt.Errorf("list %s: %w", src, err)
	}
	n := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("read CRD file: %w", err)
		}
		docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for i := 0; ; i++ {
			doc, err := docs.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return fmt.Errorf("read %s: %w", f, err)
			}
			var obj map[string]any
			if err := yaml.Unmarshal(doc, &obj); err != nil {
				return fmt.Errorf("decode %s document %d: %w", f, i, err)
			}
			if obj["kind"] != "CustomResourceDefinition" {
				continue
			}
			stripValidations(obj)
			out, err := yaml.Marshal(obj)
			if err != nil {
				return fmt.Errorf("encode %s document %d: %w", f, i, err)
			}
			name := fmt.Sprintf("%d-%s", i, filepath.Base(f))
			if err := os.WriteFile(filepath.Join(dst, name), out, 0o644); err != nil {
				return fmt.Errorf("write unvalidated copy of %s: %w", f, err)
			}
			n++
		}
	}
	if n == 0 {
		return fmt.Errorf("no CustomResourceDefinition in %s", src)
	}
	return nil
}

// stripValidations deletes every x-kubernetes-validations key under v.
func stripValidations(v any) {
	switch v := v.(type) {
	case map[string]any:
		delete(v, "x-kubernetes-validations")
		for _, child := range v {
			stripValidations(child)
		}
	case []any:
		for _, child := range v {
			stripValidations(child)
		}
	}
}

// start starts a cluster with the CRDs of crdDir and prometheus-operator's.
func start(t testing.TB, configure func(*envtest.APIServer), crdDir string) *Cluster {
	t.Helper()
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" || !exists(filepath.Join(assets, "kube-apiserver")) || !exists(filepath.Join(assets, "etcd")) {
		msg := "needs a kube-apiserver and etcd: run `make test`, or KUBEBUILDER_ASSETS=$(hack/testbin.sh) go test ..."
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	certDir, err := os.MkdirTemp("", "galactic-apiserver-")
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		// prometheus-operator's CRDs too: the monitoring component's
		// PodMonitors and PrometheusRule are checked against the schemas an
		// operator's cluster serves (testdata/prometheus-operator/README.md).
		CRDDirectoryPaths: []string{
			crdDir,
			filepath.Join(repoRoot(), "test", "framework", "clustertest", "testdata", "prometheus-operator"),
		},
		ErrorIfCRDPathMissing: true,
		// Tests stop and start the API server; with watches open its
		// graceful shutdown can outlast envtest's 20 s default.
		ControlPlaneStopTimeout: 2 * time.Minute,
	}
	apiserver := env.ControlPlane.GetAPIServer()
	apiserver.CertDir = certDir
	// Tests stop and start the server: skip the graceful drain meant for
	// load balancers, and allow for a slow machine.
	apiserver.Configure().Set("shutdown-delay-duration", "0s").Set("request-timeout", "5s")
	if configure != nil {
		configure(apiserver)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start kube-apiserver and etcd: %v", err)
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &Cluster{Env: env, Config: cfg, Client: client}
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// Apply creates obj, and sets its status through the status subresource
// when it has one. It returns the stored object.
func (c *Cluster) Apply(t testing.TB, gvr schema.GroupVersionResource, obj *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	ctx := context.Background()
	c.ensureNamespace(t, obj.GetNamespace())
	ri := c.Client.Resource(gvr).Namespace(obj.GetNamespace())
	status, hasStatus := obj.Object["status"]
	created, err := ri.Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create %s %s/%s: %v", gvr.Resource, obj.GetNamespace(), obj.GetName(), err)
	}
	if hasStatus {
		created.Object["status"] = status
		if created, err = ri.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("update status of %s %s/%s: %v", gvr.Resource, obj.GetNamespace(), obj.GetName(), err)
		}
	}
	return created
}

func (c *Cluster) ensureNamespace(t testing.TB, name string) {
	t.Helper()
	if name == "" {
		return // a cluster-scoped object
	}
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": name}}}
	_, err := c.Client.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).Create(context.Background(), ns, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", name, err)
	}
}

// Delete deletes an object; one already gone is fine.
func (c *Cluster) Delete(t testing.TB, gvr schema.GroupVersionResource, namespace, name string) {
	t.Helper()
	err := c.Client.Resource(gvr).Namespace(namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete %s %s/%s: %v", gvr.Resource, namespace, name, err)
	}
}

// DeleteAll deletes every object of gvr in all namespaces and waits until
// none is listed.
func (c *Cluster) DeleteAll(t testing.TB, gvr schema.GroupVersionResource) {
	t.Helper()
	ctx := context.Background()
	list, err := c.Client.Resource(gvr).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list %s: %v", gvr.Resource, err)
	}
	for _, o := range list.Items {
		c.Delete(t, gvr, o.GetNamespace(), o.GetName())
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		list, err := c.Client.Resource(gvr).List(ctx, metav1.ListOptions{})
		if err == nil && len(list.Items) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not all deleted: %v", gvr.Resource, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Attachment builds a VPCAttachment whose status carries (vpc, attachment)
// in base62; empty strings make one that carries no identity yet.
func Attachment(namespace, name, vpc, attachment string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cloud.datumapis.com/v1alpha1",
		"kind":       "VPCAttachment",
		"metadata":   map[string]any{"namespace": namespace, "name": name},
		"spec":       map[string]any{},
		"status": map[string]any{
			"vpc": vpc, "vpcAttachment": attachment, "node": "node-a",
			"containerID": fmt.Sprintf("%046x", len(name)), "hostInterface": "",
		},
	}}
}

// Advertisement builds a BGPAdvertisement of a node's router.
func Advertisement(namespace, name, node string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "network.datumapis.com/v1alpha1",
		"kind":       "BGPAdvertisement",
		"metadata": map[string]any{"namespace": namespace, "name": name,
			"annotations": map[string]any{"galactic.datum.net/netns.0123456789ab": "/var/run/netns/cni-1"}},
		"spec": map[string]any{"routerRef": map[string]any{"name": node}, "addressFamily": "ipv4", "prefixes": []any{"10.0.0.0/24"}},
	}}
}

// ProcessOf finds the PID of a process of a cluster: the one whose binary
// is named bin (kube-apiserver, etcd) and whose command line names dir (the
// API server's certificate folder, etcd's data folder), which tells two
// clusters on one machine apart. Tests kill it or read its /proc figures.
func ProcessOf(bin, dir string) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("find %s: %w", bin, err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if filepath.Base(args[0]) == bin && strings.Contains(string(cmdline), dir) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no %s process names %s", bin, dir)
}

// CPUSeconds is the CPU time a process has used, user and system
// (utime+stime of /proc/PID/stat, which the kernel counts in USER_HZ: 100
// a second on Linux). Benchmarks weigh what a read costs the API server
// with it.
func CPUSeconds(pid int) (float64, error) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, fmt.Errorf("cpu of %d: %w", pid, err)
	}
	// The command name, in parentheses, may hold spaces: count fields
	// after its closing one.
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("cpu of %d: %d fields in /proc/%d/stat", pid, len(f), pid)
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("cpu of %d: %w", pid, err)
	}
	return (utime + stime) / 100, nil
}
