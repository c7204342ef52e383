package k8s

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// renderCRDDoc renders the Peer CRD reference from the generated CRD (which
// is generated from the Go types), so the doc cannot drift from the API.
func renderCRDDoc(crd *apiextensionsv1.CustomResourceDefinition) string {
	var b strings.Builder
	v := crd.Spec.Versions[0]
	fmt.Fprintf(&b, "# Peer CRD reference\n\n<!-- Generated from %s by `go test ./pkg/k8s -run TestPeerCRDDoc -update`; a test fails when it is stale. -->\n\n", "manifests/crds/meshd.io_peers.yaml")
	fmt.Fprintf(&b, "`%s`, group `%s`, version `%s`, kind `%s`, scope `%s`, short name `%s`.\n\n",
		crd.Name, crd.Spec.Group, v.Name, crd.Spec.Names.Kind, crd.Spec.Scope, strings.Join(crd.Spec.Names.ShortNames, "`, `"))
	fmt.Fprintf(&b, "%s\n\n", oneLine(v.Schema.OpenAPIV3Schema.Description))
	b.WriteString("Invalid Peers are refused by the API server itself (OpenAPI and CEL rules in the CRD); no webhook is involved.\n\n")
	b.WriteString("| field | type | required | description | validation |\n|---|---|---|---|---|\n")
	spec := v.Schema.OpenAPIV3Schema.Properties["spec"]
	walkSchema(&b, "spec", spec, true)
	if status, ok := v.Schema.OpenAPIV3Schema.Properties["status"]; ok {
		b.WriteString("\n## Status\n\nWritten by meshd (the status subresource): each location leader reports its own entry in `status.leaders`; the conditions and `status.lastHandshakeTime` summarize them. See [peer status](vpn.md#peer-status).\n\n| field | type | required | description | validation |\n|---|---|---|---|---|\n")
		walkSchema(&b, "status", status, false)
	}
	b.WriteString("\n## Printer columns\n\n| column | JSON path |\n|---|---|\n")
	for _, c := range v.AdditionalPrinterColumns {
		fmt.Fprintf(&b, "| %s | `%s` |\n", c.Name, c.JSONPath)
	}
	b.WriteString(`
## Example

` + "```yaml" + `
apiVersion: meshd.io/v1alpha1
kind: Peer
metadata:
  name: laptop
spec:
  publicKey: GqkK0n0Kk3sH4pYvZ0y0mSx1qv2mJfQmWc6o7b5rU2A=
  allowedIPs:
  - 10.5.0.1/32
  persistentKeepalive: 25
` + "```\n")
	return b.String()
}

func walkSchema(b *strings.Builder, path string, s apiextensionsv1.JSONSchemaProps, required bool) {
	typ := s.Type
	if s.Type == "array" && s.Items != nil && s.Items.Schema != nil {
		typ = "[]" + s.Items.Schema.Type
	}
	var val []string
	if s.MinLength != nil {
		val = append(val, fmt.Sprintf("minLength %d", *s.MinLength))
	}
	if s.MaxLength != nil {
		val = append(val, fmt.Sprintf("maxLength %d", *s.MaxLength))
	}
	if s.MinItems != nil {
		val = append(val, fmt.Sprintf("minItems %d", *s.MinItems))
	}
	if s.MaxItems != nil {
		val = append(val, fmt.Sprintf("maxItems %d", *s.MaxItems))
	}
	if s.Minimum != nil {
		val = append(val, fmt.Sprintf("minimum %g", *s.Minimum))
	}
	if s.Maximum != nil {
		val = append(val, fmt.Sprintf("maximum %g", *s.Maximum))
	}
	if s.Pattern != "" {
		val = append(val, fmt.Sprintf("pattern `%s`", s.Pattern))
	}
	rules := s.XValidations
	if s.Items != nil && s.Items.Schema != nil {
		rules = append(rules, s.Items.Schema.XValidations...)
	}
	for _, r := range rules {
		val = append(val, fmt.Sprintf("CEL `%s`", strings.ReplaceAll(r.Rule, "|", `\|`)))
	}
	req := "no"
	if required {
		req = "yes"
	}
	fmt.Fprintf(b, "| `%s` | %s | %s | %s | %s |\n", path, typ, req, oneLine(s.Description), strings.Join(val, "; "))
	names := make([]string, 0, len(s.Properties))
	for n := range s.Properties {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		walkSchema(b, path+"."+n, s.Properties[n], contains(s.Required, n))
	}
	if s.Type == "array" && s.Items != nil && s.Items.Schema != nil && len(s.Items.Schema.Properties) > 0 && !strings.HasSuffix(path, ".conditions") {
		walkSchema(b, path+"[]", *s.Items.Schema, true)
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func oneLine(s string) string {
	return strings.ReplaceAll(strings.Join(strings.Fields(s), " "), "|", `\|`)
}

var updateDocs = flag.Bool("update", false, "rewrite generated docs")

func TestPeerCRDDoc(t *testing.T) {
	root := filepath.Join("..", "..")
	data, err := os.ReadFile(filepath.Join(root, "manifests", "crds", "meshd.io_peers.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatalf("decoding the CRD: %v", err)
	}
	want := renderCRDDoc(&crd)
	path := filepath.Join(root, "docs", "peer-crd.md")
	if *updateDocs {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != want {
		t.Fatalf("%s is stale or missing: run `go test ./pkg/k8s -run TestPeerCRDDoc -update`", path)
	}
	for _, f := range []string{"spec.publicKey", "spec.allowedIPs", "spec.endpoint.host", "spec.endpoint.port", "spec.persistentKeepalive", "spec.presharedKeySecretRef"} {
		if !strings.Contains(want, "`"+f+"`") {
			t.Errorf("reference misses %s", f)
		}
	}
}
