package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// TestTheDaemonsSeccompProfileRefusesWhatRuntimeDefaultRefuses runs a probe
// (testdata/seccompprobe) in the node image with the daemon container's
// security context and seccomp profile, as the DaemonSet runs it: new user
// and network namespaces, unshare, mount, ptrace, vmsplice, personality
// changes and audit sockets are refused, and bpf(2) and rtnetlink work. The
// same probe under no profile first shows each call reaching the kernel, so
// that a rule deleted from the profile fails this test. mount is probed
// with CAP_SYS_ADMIN added too: the profile refuses it whatever the
// capabilities.
func TestTheDaemonsSeccompProfileRefusesWhatRuntimeDefaultRefuses(t *testing.T) {
	requirePodman(t)
	image := loadImage(t, "galactic-node")
	_, tmpl := workload(t, "DaemonSet", "galactic-node")
	spec := tmpl.Spec.DeepCopy()
	daemon := spec.Containers[0]

	bin := t.TempDir()
	if out, err := goBuild("-o", filepath.Join(bin, "seccompprobe"), "./testdata/seccompprobe").CombinedOutput(); err != nil {
		t.Fatalf("build the probe: %v\n%s", err, out)
	}
	seccompRoot := t.TempDir()
	profile, err := os.ReadFile("../deploy/node/seccomp/galactic-node.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(seccompRoot, "galactic"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(seccompRoot, "galactic", "galactic-node.json"), profile, 0o644); err != nil {
		t.Fatal(err)
	}
	spec.Volumes = []corev1.Volume{{Name: "probe", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: bin}}}}
	ns := nettest.NewNS(t)

	probe := func(t *testing.T, name string, c corev1.Container, extra ...string) map[string]string {
		t.Helper()
		c.Command, c.Args, c.Env = []string{"/probe/seccompprobe"}, nil, nil
		c.VolumeMounts = []corev1.VolumeMount{{Name: "probe", MountPath: "/probe", ReadOnly: true}}
		c.Resources = corev1.ResourceRequirements{}
		s := kubeletScene{netns: "/run/netns/" + ns.Name, hostPaths: map[string]string{"probe": bin}, hostname: "node-a",
			imageID: image, seccompRoot: seccompRoot, containerN: fmt.Sprintf("galactic-test-seccomp-%s-%s", name, ns.Name)}
		noToken := false
		spec.AutomountServiceAccountToken = &noToken
		args := podmanRun(t, spec, c, s)
		// Extra options go before the image.
		for i, a := range args {
			if a == image {
				args = append(args[:i], append(extra, args[i:]...)...)
				break
			}
		}
		ctr := startContainer(t, args)
		if err := ctr.cmd.Wait(); err != nil {
			t.Fatalf("probe %s: %v\n%s", name, err, ctr.log.String())
		}
		got := map[string]string{}
		for _, line := range strings.Split(ctr.log.String(), "\n") {
			if f := strings.Fields(line); len(f) >= 2 {
				got[f[0]] = f[1]
			}
		}
		return got
	}
	unconfined := func(c corev1.Container) corev1.Container {
		sc := c.SecurityContext.DeepCopy()
		sc.SeccompProfile = nil
		c.SecurityContext = sc
		return c
	}
	withSysAdmin := func(c corev1.Container) corev1.Container {
		sc := c.SecurityContext.DeepCopy()
		sc.Capabilities.Add = append(sc.Capabilities.Add, "SYS_ADMIN")
		c.SecurityContext = sc
		return c
	}

	// The control: with the daemon's capabilities and no profile, every
	// probed call reaches the kernel.
	control := probe(t, "control", unconfined(daemon), "--security-opt", "seccomp=unconfined")
	for _, call := range []string{"clone_newuser", "unshare", "mount", "ptrace", "vmsplice", "personality", "netlink_audit", "netlink_route", "bpf"} {
		if control[call] != "allowed" {
			t.Fatalf("without a profile %s is %q: the probe cannot tell the profile's refusal from the kernel's\n%v", call, control[call], control)
		}
	}

	got := probe(t, "profile", daemon)
	for _, call := range []string{"clone_newuser", "unshare", "mount", "ptrace", "vmsplice", "personality", "netlink_audit"} {
		if got[call] != "refused" {
			t.Errorf("the daemon's profile lets %s through (%q)", call, got[call])
		}
	}
	for _, call := range []string{"bpf", "netlink_route"} {
		if got[call] != "allowed" {
			t.Errorf("the daemon's profile refuses %s, which the daemon needs (%q)", call, got[call])
		}
	}
	if got := probe(t, "sysadmin", withSysAdmin(daemon)); got["mount"] != "refused" {
		t.Errorf("with CAP_SYS_ADMIN the daemon's profile lets mount through (%q)", got["mount"])
	}
}
