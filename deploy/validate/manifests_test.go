// Package validate checks the deployment files of deploy/ as the tools
// that read them would, without a cluster or a Prometheus server: every
// Kubernetes manifest of deploy/kubernetes decodes into its typed object
// (k8s.io/api) with no unknown field, and follows the rules
// docs/DEPLOYMENT.md states (resources, probes on /healthz, a non-root user
// on a read-only root file system, secrets in mounted files only); the
// alert rules of deploy/prometheus parse as Prometheus parses them, PromQL
// and templates included.
//
// It is a module of its own, so that k8s.io/api and Prometheus's own module
// never enter the library's module graph; make test runs it
// (scripts/test.sh), and the metrics the rules name are checked against
// the code by package deploy's TestAlertMetrics.
package validate

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// object is a manifest's document, decoded.
type object struct {
	file string
	kind string
	name string
	obj  any
}

func (o object) String() string { return o.file + ": " + o.kind + " " + o.name }

// kinds are the objects deploy/kubernetes may hold, by apiVersion and kind.
var kinds = map[string]func() any{
	"apps/v1 Deployment": func() any { return &appsv1.Deployment{} },
	"batch/v1 Job":       func() any { return &batchv1.Job{} },
	"v1 Service":         func() any { return &corev1.Service{} },
}

// readManifests decodes every document of deploy/kubernetes/*.yaml
// strictly: a field its type does not have, or a field given twice, is an
// error, as kubectl apply --validate=strict refuses it.
func readManifests(t *testing.T) []object {
	t.Helper()
	files, err := filepath.Glob("../kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifest in deploy/kubernetes: %v", err)
	}
	var objs []object
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range splitDocuments(b) {
			where := fmt.Sprintf("%s, document %d", filepath.Base(f), i+1)
			var meta struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			newObj, ok := kinds[meta.APIVersion+" "+meta.Kind]
			if !ok {
				t.Errorf("%s: %s %s is not a kind this test knows: add it to kinds", where, meta.APIVersion, meta.Kind)
				continue
			}
			obj := newObj()
			if err := yaml.UnmarshalStrict(doc, obj); err != nil {
				t.Errorf("%s (%s %s): %v", where, meta.Kind, meta.Metadata.Name, err)
				continue
			}
			if meta.Metadata.Name == "" {
				t.Errorf("%s: %s without a name", where, meta.Kind)
			}
			objs = append(objs, object{file: filepath.Base(f), kind: meta.Kind, name: meta.Metadata.Name, obj: obj})
		}
	}
	return objs
}

// splitDocuments splits a YAML stream on its "---" lines, dropping the
// documents that hold only comments.
func splitDocuments(b []byte) [][]byte {
	var docs [][]byte
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		content := false
		for _, line := range strings.Split(doc, "\n") {
			line = strings.TrimSpace(line)
			content = content || line != "" && !strings.HasPrefix(line, "#")
		}
		if content {
			docs = append(docs, []byte(doc))
		}
	}
	return docs
}

// TestManifests: every manifest decodes strictly, and each pod follows
// the rules below.
func TestManifests(t *testing.T) {
	objs := readManifests(t)
	var deployments []*appsv1.Deployment
	tags := map[string]bool{}
	for _, o := range objs {
		switch obj := o.obj.(type) {
		case *appsv1.Deployment:
			deployments = append(deployments, obj)
			checkSelector(t, o, obj.Spec.Selector.MatchLabels, obj.Spec.Template.Labels)
			checkPod(t, o, &obj.Spec.Template.Spec, true, tags)
			if obj.Spec.Replicas == nil || *obj.Spec.Replicas < 2 {
				t.Errorf("%s: fewer than 2 replicas: every process here runs as several (leases, standbys, partitions)", o)
			}
		case *batchv1.Job:
			checkPod(t, o, &obj.Spec.Template.Spec, false, tags)
		}
	}
	for _, o := range objs {
		if svc, ok := o.obj.(*corev1.Service); ok {
			checkService(t, o, svc, deployments)
		}
	}
	if len(tags) != 1 {
		t.Errorf("the manifests' images have the tags %v: give them all the release's", slices.Sorted(maps.Keys(tags)))
	}
	for _, want := range []string{"idem-relay", "idem-cdc", "idem-migrate"} {
		if !slices.ContainsFunc(objs, func(o object) bool { return o.name == want }) {
			t.Errorf("no manifest of %s", want)
		}
	}
}

// checkSelector: the selector picks the template's pods.
func checkSelector(t *testing.T, o object, selector, labels map[string]string) {
	t.Helper()
	if len(selector) == 0 {
		t.Errorf("%s: an empty selector", o)
	}
	for k, v := range selector {
		if labels[k] != v {
			t.Errorf("%s: the selector's %s=%s is not a label of the template", o, k, v)
		}
	}
}

// imageRef matches the images scripts/image.sh builds, in a registry, with
// a release's tag.
var imageRef = regexp.MustCompile(`^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*/(idem|idem-shop):(v[0-9]+\.[0-9]+\.[0-9]+)$`)

// checkPod applies the rules of every pod: a non-root user (the images'),
// and for each container an image of ours, resources, a read-only root
// file system without privileges, secrets in files mounted from Secrets
// and never in the environment or the arguments, and for a long-running
// one (service) readiness and liveness probes on /healthz at the port its
// admin address listens on.
func checkPod(t *testing.T, o object, pod *corev1.PodSpec, service bool, tags map[string]bool) {
	t.Helper()
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != 65532 {
		t.Errorf("%s: the pod needs securityContext runAsNonRoot: true and runAsUser: 65532 (the images' user)", o)
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: the pod needs securityContext.seccompProfile.type RuntimeDefault", o)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("%s: automountServiceAccountToken: false (nothing here talks to the Kubernetes API)", o)
	}
	secretVolumes := map[string]bool{}
	for _, v := range pod.Volumes {
		if v.Secret != nil {
			secretVolumes[v.Name] = true
		}
	}
	if len(pod.Containers) == 0 {
		t.Errorf("%s: no container", o)
	}
	for i, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		init := i < len(pod.InitContainers)
		co := o
		co.name += " container " + c.Name
		m := imageRef.FindStringSubmatch(c.Image)
		if m == nil {
			t.Errorf("%s: image %q is not REGISTRY/idem:vX.Y.Z or REGISTRY/idem-shop:vX.Y.Z (make image builds them)", co, c.Image)
			continue
		}
		tags[m[4]] = true
		checkResources(t, co, c.Resources)
		checkContainerSecurity(t, co, c.SecurityContext)
		mounts := checkSecrets(t, co, c, secretVolumes)
		if service && !init {
			checkProbes(t, co, c, m[3])
		}
		checkSecretFiles(t, co, c, m[3], mounts)
	}
}

func checkResources(t *testing.T, o object, r corev1.ResourceRequirements) {
	t.Helper()
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := r.Requests[name]; !ok || q.IsZero() {
			t.Errorf("%s: no %s request", o, name)
		}
	}
	if q, ok := r.Limits[corev1.ResourceMemory]; !ok || q.IsZero() {
		t.Errorf("%s: no memory limit", o)
	} else if q.Cmp(r.Requests[corev1.ResourceMemory]) < 0 {
		t.Errorf("%s: the memory limit is below the request", o)
	}
}

func checkContainerSecurity(t *testing.T, o object, sc *corev1.SecurityContext) {
	t.Helper()
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("%s: securityContext.readOnlyRootFilesystem must be true", o)
	}
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: securityContext.allowPrivilegeEscalation must be false", o)
	}
	if sc == nil || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
		t.Errorf("%s: securityContext.capabilities must drop ALL and add none", o)
	}
	if sc != nil && (sc.Privileged != nil && *sc.Privileged || sc.RunAsUser != nil && *sc.RunAsUser == 0) {
		t.Errorf("%s: privileged or root", o)
	}
}

// secretLike names a variable or a flag that may hold a secret.
var secretLike = regexp.MustCompile(`(?i)url|dsn|token|password|secret|credential|auth`)

// credentials matches a URL with a user (and maybe a password).
var credentials = regexp.MustCompile(`://[^/@\s]+@`)

// checkSecrets: no secret in the environment (a literal or a Secret's key:
// both show in "kubectl describe" or /proc/PID/environ) or in the
// arguments (ps shows them); the mounts of Secret volumes are read-only.
// It returns the directories where Secrets are mounted.
func checkSecrets(t *testing.T, o object, c corev1.Container, secretVolumes map[string]bool) []string {
	t.Helper()
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			t.Errorf("%s: variable %s comes from a Secret: mount the Secret and give the file (--db-file...)", o, e.Name)
		}
		if secretLike.MatchString(e.Name) && !strings.HasSuffix(e.Name, "_FILE") {
			t.Errorf("%s: variable %s may hold a secret: give it in a mounted file", o, e.Name)
		}
	}
	if len(c.EnvFrom) > 0 {
		t.Errorf("%s: envFrom puts a whole ConfigMap or Secret in the environment", o)
	}
	for _, a := range slices.Concat(c.Command, c.Args) {
		flag, _, _ := strings.Cut(a, "=")
		if flag == "--db" || flag == "--broker" || strings.HasPrefix(flag, "--") && strings.HasSuffix(flag, "-db") {
			t.Errorf("%s: %s: a database or broker URL on the command line (ps shows it): give %s-file and a mounted file", o, flag, flag)
		}
		if credentials.MatchString(a) || strings.Contains(strings.ToLower(a), "password") {
			t.Errorf("%s: argument %q: a secret on the command line (ps shows it): give it in a file", o, a)
		}
	}
	var mounts []string
	for _, m := range c.VolumeMounts {
		if secretVolumes[m.Name] {
			if !m.ReadOnly {
				t.Errorf("%s: the Secret mounted at %s must be readOnly", o, m.MountPath)
			}
			mounts = append(mounts, m.MountPath)
		}
	}
	return mounts
}

// checkSecretFiles: every file flag (--db-file, --broker-file,
// --auth-token-file...) and every *_FILE variable names a file in a
// mounted Secret, and a container that reaches a database or a broker
// reads its URL from one.
func checkSecretFiles(t *testing.T, o object, c corev1.Container, image string, mounts []string) {
	t.Helper()
	files := map[string]string{}
	for i, a := range c.Args {
		if strings.HasPrefix(a, "--") && strings.HasSuffix(a, "-file") && i+1 < len(c.Args) {
			files[a] = c.Args[i+1]
		}
	}
	for _, e := range c.Env {
		if strings.HasSuffix(e.Name, "_FILE") {
			files[e.Name] = e.Value
		}
	}
	for flag, path := range files {
		if !slices.ContainsFunc(mounts, func(m string) bool { return filepath.Dir(path) == filepath.Clean(m) }) {
			t.Errorf("%s: %s %s is not in a mounted Secret (mounted: %q)", o, flag, path, mounts)
		}
	}
	if _, ok := files["--db-file"]; !ok {
		t.Errorf("%s: no --db-file: the database URL, with its password, comes from a mounted Secret", o)
	}
	needsBroker := image == "idem-shop" || len(c.Args) > 0 && (c.Args[0] == "relay" || c.Args[0] == "cdc")
	if _, ok := files["--broker-file"]; needsBroker && !ok {
		t.Errorf("%s: no --broker-file: the broker URL comes from a mounted Secret", o)
	}
}

// checkProbes: readiness and liveness probes GET /healthz at the port the
// container's admin address listens on (--metrics-addr of idem relay and
// idem cdc, --admin-addr of the shop), a port it declares, beyond
// loopback and with a token (or the address refuses to start).
func checkProbes(t *testing.T, o object, c corev1.Container, image string) {
	t.Helper()
	addrFlag := "--metrics-addr"
	if image == "idem-shop" {
		addrFlag = "--admin-addr"
	}
	addr := flagArg(c.Args, addrFlag)
	host, portText, err := splitHostPort(addr)
	if err != nil {
		t.Errorf("%s: %s %q: give the admin address explicitly, beyond loopback (:PORT): %v", o, addrFlag, addr, err)
		return
	}
	if host == "127.0.0.1" || host == "localhost" || host == "::1" {
		t.Errorf("%s: %s %s listens on loopback: the kubelet's probes and Prometheus cannot reach it", o, addrFlag, addr)
	}
	if flagArg(c.Args, "--auth-token-file") == "" {
		t.Errorf("%s: %s beyond loopback without --auth-token-file: the address refuses to start", o, addrFlag)
	}
	port, _ := strconv.Atoi(portText)
	for _, p := range []struct {
		kind  string
		probe *corev1.Probe
	}{{"readiness", c.ReadinessProbe}, {"liveness", c.LivenessProbe}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: no %s probe on GET /healthz", o, p.kind)
			continue
		}
		if p.probe.HTTPGet.Path != "/healthz" {
			t.Errorf("%s: the %s probe gets %s, want /healthz (open without the token)", o, p.kind, p.probe.HTTPGet.Path)
		}
		if got := resolvePort(c, p.probe.HTTPGet.Port); got != port {
			t.Errorf("%s: the %s probe's port %s is %d, but %s listens on %d", o, p.kind, p.probe.HTTPGet.Port.String(), got, addrFlag, port)
		}
	}
}

// resolvePort returns the number of a port given by name or number, or
// 0 when the container declares no port of that name.
func resolvePort(c corev1.Container, p intstr.IntOrString) int {
	if p.Type == intstr.Int {
		return p.IntValue()
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort)
		}
	}
	return 0
}

// checkService: the Service selects the pods of a Deployment and targets
// a port they declare.
func checkService(t *testing.T, o object, svc *corev1.Service, deployments []*appsv1.Deployment) {
	t.Helper()
	var target *appsv1.Deployment
	for _, d := range deployments {
		if matches(svc.Spec.Selector, d.Spec.Template.Labels) {
			target = d
		}
	}
	if target == nil {
		t.Errorf("%s: its selector %v selects no Deployment's pods", o, svc.Spec.Selector)
		return
	}
	for _, p := range svc.Spec.Ports {
		found := false
		for _, c := range target.Spec.Template.Spec.Containers {
			port := resolvePort(c, p.TargetPort)
			found = found || slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool { return int(cp.ContainerPort) == port })
		}
		if !found {
			t.Errorf("%s: port %s targets %s, which no container of %s declares", o, p.Name, p.TargetPort.String(), target.Name)
		}
	}
}

func matches(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// flagArg returns the value after flag in args, or "".
func flagArg(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}

// splitHostPort splits an address as net.Listen takes it (":9464").
func splitHostPort(addr string) (host, port string, err error) {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return "", "", errors.New("no port")
	}
	host, port = strings.Trim(addr[:i], "[]"), addr[i+1:]
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return "", "", fmt.Errorf("port %q", port)
	}
	return host, port, nil
}

// TestSplitDocuments: documents of comments only are dropped; the others
// are kept whole.
func TestSplitDocuments(t *testing.T) {
	docs := splitDocuments([]byte("# head\n---\na: 1\n# c\n---\n\n---\nb: 2\n"))
	var got []string
	for _, d := range docs {
		got = append(got, strings.TrimSpace(string(d)))
	}
	if want := []string{"a: 1\n# c", "b: 2"}; !slices.Equal(got, want) {
		t.Errorf("splitDocuments = %q, want %q", got, want)
	}
}
