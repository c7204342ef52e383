package mirror

import (
	"os"
	"path/filepath"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// TestServiceExportCRD checks the hand-written CRD serves the resource the
// mirror watches, in the upstream shape.
func TestServiceExportCRD(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "manifests", "crds", "multicluster.x-k8s.io_serviceexports.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(data, &crd); err != nil {
		t.Fatalf("parsing the CRD: %v", err)
	}
	s := crd.Spec
	if crd.Name != ServiceExportGVR.Resource+"."+ServiceExportGVR.Group || s.Group != ServiceExportGVR.Group ||
		s.Names.Plural != ServiceExportGVR.Resource || s.Names.Kind != "ServiceExport" || s.Scope != apiextensionsv1.NamespaceScoped {
		t.Fatalf("CRD names %s %+v scope %s", crd.Name, s.Names, s.Scope)
	}
	if len(s.Versions) != 1 || s.Versions[0].Name != ServiceExportGVR.Version || !s.Versions[0].Served || !s.Versions[0].Storage {
		t.Fatalf("versions %+v", s.Versions)
	}
	v := s.Versions[0]
	if v.Subresources == nil || v.Subresources.Status == nil {
		t.Errorf("no status subresource")
	}
	props := v.Schema.OpenAPIV3Schema.Properties
	if spec := props["spec"]; spec.Type != "object" || len(spec.Properties) != 0 {
		t.Errorf("spec %+v, want an empty object", spec)
	}
	conds := props["status"].Properties["conditions"]
	if conds.Type != "array" || conds.Items == nil || conds.Items.Schema.Properties["type"].Type != "string" ||
		conds.XListType == nil || *conds.XListType != "map" {
		t.Errorf("status.conditions %+v", conds)
	}
}
