package v1alpha1_test

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
	"k8s.io/kube-openapi/pkg/validation/validate"
	"sigs.k8s.io/yaml"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
)

// repoRoot is the module root, three directories up from this package's
// directory (pkg/k8s/apis/meshd/v1alpha1).
const repoRoot = "../../../../.."

const crdFile = "manifests/crds/meshd.io_peers.yaml"

// TestCRDUpToDate regenerates the CRDs into a temporary directory and
// compares them with manifests/crds.
func TestCRDUpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs controller-gen")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH")
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cmd := exec.Command(goBin, "tool", "controller-gen", "crd", "paths=./pkg/k8s/apis/...", "output:crd:dir="+out)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("running controller-gen: %v\n%s", err, b)
	}
	generated, err := filepath.Glob(filepath.Join(out, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// Only meshd.io CRDs are generated; others (ServiceExport) are written by hand.
	committed, err := filepath.Glob(filepath.Join(root, "manifests/crds/meshd.io_*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const fix = "manifests/crds is stale: run ./hack/update-codegen.sh and commit the result"
	if len(generated) != len(committed) {
		t.Fatalf("%s (generated %d CRD files, manifests/crds has %d)", fix, len(generated), len(committed))
	}
	for _, g := range generated {
		name := filepath.Base(g)
		want, err := os.ReadFile(g)
		if err != nil {
			t.Fatal(err)
		}
		have, err := os.ReadFile(filepath.Join(root, "manifests/crds", name))
		if err != nil {
			t.Fatalf("%s (%v)", fix, err)
		}
		if !bytes.Equal(want, have) {
			t.Errorf("%s (%s differs from the Go types in pkg/k8s/apis)", fix, name)
		}
	}
}

// crdSchema loads the committed CRD and returns the structural schema of its
// only version.
func crdSchema(t *testing.T) *schema.Structural {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, crdFile))
	if err != nil {
		t.Fatal(err)
	}
	var v1crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(b, &v1crd); err != nil {
		t.Fatalf("parsing %s: %v", crdFile, err)
	}
	apiextensionsv1.SetObjectDefaults_CustomResourceDefinition(&v1crd)
	if v1crd.Name != "peers.meshd.io" || v1crd.Spec.Scope != apiextensionsv1.ClusterScoped || len(v1crd.Spec.Versions) != 1 || v1crd.Spec.Versions[0].Name != "v1alpha1" {
		t.Fatalf("unexpected CRD %s: scope %s, versions %+v", v1crd.Name, v1crd.Spec.Scope, v1crd.Spec.Versions)
	}
	version := v1crd.Spec.Versions[0]
	var columns []string
	for _, c := range version.AdditionalPrinterColumns {
		columns = append(columns, c.Name)
	}
	if got := strings.Join(columns, ","); got != "Allowed IPs,Endpoint,Port,Accepted,Applied,Handshake,Reason,Age" {
		t.Errorf("printer columns %s", got)
	}
	// The status is a subresource: nodes write it with peers/status only,
	// and a status write never bumps the generation the planner watches.
	if version.Subresources == nil || version.Subresources.Status == nil {
		t.Error("the Peer CRD has no status subresource")
	}
	var props apiextensions.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(version.Schema.OpenAPIV3Schema, &props, nil); err != nil {
		t.Fatal(err)
	}
	s, err := schema.NewStructural(&props)
	if err != nil {
		t.Fatalf("the schema is not structural: %v", err)
	}
	if errs := schema.ValidateStructural(nil, s); len(errs) > 0 {
		t.Fatalf("the schema is not structural: %v", errs.ToAggregate())
	}
	return s
}

// celRule emulates one of the CRD's CEL rules offline. The emulation covers
// exactly the rule shapes the types use (regular expressions are RE2 in both
// CEL and Go); TestCRDValidation fails on any other rule, so a new rule needs
// an emulation here. The real API server is exercised by the e2e tests.
func celRule(t *testing.T, rule string) func(any) bool {
	t.Helper()
	celRulePattern := regexp.MustCompile(`^(isIP\(self\) \|\| )?self\.matches\('([^']*)'\)$`)
	if rule == "isCIDR(self)" {
		return func(v any) bool {
			s, _ := v.(string)
			_, err := netip.ParsePrefix(s)
			return err == nil
		}
	}
	m := celRulePattern.FindStringSubmatch(rule)
	if m == nil {
		t.Fatalf("CEL rule %q has no offline emulation in crd_test.go; add one", rule)
	}
	re := regexp.MustCompile(m[2])
	orIP := m[1] != ""
	return func(v any) bool {
		s, _ := v.(string)
		if orIP {
			if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
				return true
			}
		}
		return re.MatchString(s)
	}
}

// evalRules walks obj along s and evaluates every x-kubernetes-validations
// rule like the API server: "<path>: Invalid value: <message>".
func evalRules(t *testing.T, s *schema.Structural, v any, path string) []string {
	if v == nil || s == nil {
		return nil
	}
	var errs []string
	for _, r := range s.XValidations {
		if !celRule(t, r.Rule)(v) {
			errs = append(errs, fmt.Sprintf("%s: Invalid value: %s", path, r.Message))
		}
	}
	switch v := v.(type) {
	case map[string]any:
		for k, sub := range s.Properties {
			p := k
			if path != "" {
				p = path + "." + k
			}
			errs = append(errs, evalRules(t, &sub, v[k], p)...)
		}
	case []any:
		for i, item := range v {
			errs = append(errs, evalRules(t, s.Items, item, fmt.Sprintf("%s[%d]", path, i))...)
		}
	}
	return errs
}

// validatePeer runs the OpenAPI validation of a Peer (as the API server does)
// and the emulated CEL rules.
func validatePeer(t *testing.T, s *schema.Structural, p *v1alpha1.Peer) []string {
	t.Helper()
	p.APIVersion, p.Kind = "meshd.io/v1alpha1", "Peer"
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		t.Fatal(err)
	}
	var errs []string
	res := validate.NewSchemaValidator(s.ToKubeOpenAPI(), nil, "", strfmt.Default).Validate(obj)
	for _, e := range res.Errors {
		errs = append(errs, e.Error())
	}
	return append(errs, evalRules(t, s, obj, "")...)
}

func TestCRDValidation(t *testing.T) {
	s := crdSchema(t)
	const key = "kIy0nfQEpIEAJZObM3TQbnoZsVrgwAIlB0zVyZPuuG0="
	valid := func() *v1alpha1.Peer {
		ka := int32(25)
		return &v1alpha1.Peer{
			ObjectMeta: metav1.ObjectMeta{Name: "laptop"},
			Spec: v1alpha1.PeerSpec{
				PublicKey:             key,
				AllowedIPs:            []string{"10.5.0.1/32", "fd05::/64"},
				Endpoint:              &v1alpha1.PeerEndpoint{Host: "vpn.example.com", Port: 51820},
				PersistentKeepalive:   &ka,
				PresharedKeySecretRef: &v1alpha1.SecretKeyRef{Name: "psk", Namespace: "meshd-system", Key: "laptop.psk"},
			},
		}
	}
	tests := []struct {
		name string
		mod  func(*v1alpha1.PeerSpec)
		// wantField and wantMsg must both appear in the error; empty means valid.
		wantField, wantMsg string
	}{
		{name: "valid full"},
		{name: "valid minimal", mod: func(s *v1alpha1.PeerSpec) {
			s.Endpoint, s.PersistentKeepalive, s.PresharedKeySecretRef = nil, nil, nil
		}},
		{name: "IPv4 host", mod: func(s *v1alpha1.PeerSpec) { s.Endpoint.Host = "203.0.113.7" }},
		{name: "IPv6 host", mod: func(s *v1alpha1.PeerSpec) { s.Endpoint.Host = "2001:db8::7" }},
		{name: "keepalive 0", mod: func(s *v1alpha1.PeerSpec) { v := int32(0); s.PersistentKeepalive = &v }},
		{name: "port 65535", mod: func(s *v1alpha1.PeerSpec) { s.Endpoint.Port = 65535 }},

		{name: "short key", mod: func(s *v1alpha1.PeerSpec) { s.PublicKey = "abc=" }, wantField: "spec.publicKey", wantMsg: "spec.publicKey"},
		{name: "key without padding", mod: func(s *v1alpha1.PeerSpec) { s.PublicKey = key[:43] + "A" }, wantField: "spec.publicKey", wantMsg: "spec.publicKey must be a base64-encoded 32-byte"},
		{name: "key with bad last char", mod: func(s *v1alpha1.PeerSpec) { s.PublicKey = key[:42] + "1=" }, wantField: "spec.publicKey", wantMsg: "spec.publicKey must be a base64-encoded 32-byte"},
		{name: "key with bad alphabet", mod: func(s *v1alpha1.PeerSpec) { s.PublicKey = "-" + key[1:] }, wantField: "spec.publicKey", wantMsg: "spec.publicKey must be"},
		{name: "no allowed IPs", mod: func(s *v1alpha1.PeerSpec) { s.AllowedIPs = []string{} }, wantField: "spec.allowedIPs", wantMsg: "at least 1"},
		{name: "bad CIDR", mod: func(s *v1alpha1.PeerSpec) { s.AllowedIPs = []string{"10.0.0.0/8", "10.0.0.1"} }, wantField: "spec.allowedIPs", wantMsg: "spec.allowedIPs entries must be CIDRs"},
		{name: "CIDR prefix too long", mod: func(s *v1alpha1.PeerSpec) { s.AllowedIPs = []string{"10.0.0.0/33"} }, wantField: "spec.allowedIPs", wantMsg: "spec.allowedIPs entries must be CIDRs"},
		{name: "port 0", mod: func(s *v1alpha1.PeerSpec) { s.Endpoint.Port = 0 }, wantField: "spec.endpoint.port", wantMsg: "greater than or equal to 1"},
		{name: "port 65536", mod: func(s *v1alpha1.PeerSpec) { s.Endpoint.Port = 65536 }, wantField: "spec.endpoint.port", wantMsg: "less than or equal to 65535"},
		{name: "bad host", mod: func(s *v1alpha1.PeerSpec) { s.Endpoint.Host = "bad_host!" }, wantField: "spec.endpoint.host", wantMsg: "spec.endpoint.host must be a DNS-1123 subdomain"},
		{name: "bracketed IPv6 host", mod: func(s *v1alpha1.PeerSpec) { s.Endpoint.Host = "[2001:db8::7]" }, wantField: "spec.endpoint.host", wantMsg: "spec.endpoint.host must be"},
		{name: "host with port", mod: func(s *v1alpha1.PeerSpec) { s.Endpoint.Host = "vpn.example.com:51820" }, wantField: "spec.endpoint.host", wantMsg: "spec.endpoint.host must be"},
		{name: "negative keepalive", mod: func(s *v1alpha1.PeerSpec) { v := int32(-1); s.PersistentKeepalive = &v }, wantField: "spec.persistentKeepalive", wantMsg: "greater than or equal to 0"},
		{name: "secret ref without namespace", mod: func(s *v1alpha1.PeerSpec) { s.PresharedKeySecretRef.Namespace = "" }, wantField: "spec.presharedKeySecretRef.namespace", wantMsg: "namespace"},
		{name: "secret ref bad name", mod: func(s *v1alpha1.PeerSpec) { s.PresharedKeySecretRef.Name = "Bad Name" }, wantField: "spec.presharedKeySecretRef.name", wantMsg: "spec.presharedKeySecretRef.name must be"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := valid()
			if tt.mod != nil {
				tt.mod(&p.Spec)
			}
			errs := validatePeer(t, s, p)
			if tt.wantField == "" {
				if len(errs) > 0 {
					t.Fatalf("valid Peer refused: %v", errs)
				}
				return
			}
			if len(errs) == 0 {
				t.Fatalf("invalid Peer accepted")
			}
			msg := strings.Join(errs, "; ")
			if !strings.Contains(msg, tt.wantField) || !strings.Contains(msg, tt.wantMsg) {
				t.Errorf("error %q does not name %q with %q", msg, tt.wantField, tt.wantMsg)
			}
		})
	}
}
