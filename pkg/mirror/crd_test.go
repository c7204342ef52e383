package mirror

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	mcscrd "sigs.k8s.io/mcs-api/config/crd"
	"sigs.k8s.io/yaml"
)

const mcsCRDDir = "../../manifests/components/mcs-crds"

func readCRD(t *testing.T, file string) (*apiextensionsv1.CustomResourceDefinition, []byte) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(mcsCRDDir, file))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(data, &crd); err != nil {
		t.Fatalf("parsing %s: %v", file, err)
	}
	return &crd, data
}

// TestMCSCRDsAreUpstream: the component ships the mcs-api module's CRDs
// byte for byte, serving what the mirror reads (v1beta1 stored, v1alpha1
// still served) with a status subresource.
func TestMCSCRDsAreUpstream(t *testing.T) {
	for _, tc := range []struct {
		file     string
		upstream []byte
		gvr      schema.GroupVersionResource
	}{
		{"multicluster.x-k8s.io_serviceexports.yaml", mcscrd.ServiceExportCRD, ServiceExportGVR},
		{"multicluster.x-k8s.io_serviceimports.yaml", mcscrd.ServiceImportCRD, ServiceImportGVR},
	} {
		crd, data := readCRD(t, tc.file)
		if !bytes.Equal(data, tc.upstream) {
			t.Errorf("%s differs from sigs.k8s.io/mcs-api's config/crd (copy it unchanged from the module)", tc.file)
		}
		if crd.Name != tc.gvr.Resource+"."+tc.gvr.Group {
			t.Errorf("%s: name %s", tc.file, crd.Name)
		}
		versions := map[string]apiextensionsv1.CustomResourceDefinitionVersion{}
		for _, v := range crd.Spec.Versions {
			versions[v.Name] = v
		}
		if v := versions["v1beta1"]; !v.Served || !v.Storage || v.Subresources == nil || v.Subresources.Status == nil {
			t.Errorf("%s: v1beta1 %+v, want served, stored, with status", tc.file, v)
		}
		if v := versions["v1alpha1"]; !v.Served || v.Storage {
			t.Errorf("%s: v1alpha1 served %v storage %v, want served, not stored", tc.file, v.Served, v.Storage)
		}
		if tc.gvr.Version != "v1beta1" {
			t.Errorf("the mirror uses %s, want the stored v1beta1", tc.gvr)
		}
	}
}

// TestClusterPropertyCRD: the About API's shape (sigs.k8s.io/about-api):
// cluster-scoped, v1beta1 stored with a status subresource, v1alpha1 (what
// meshd reads) still served, both with a required string spec.value and
// the same schema for spec, so the API server converts without a webhook.
func TestClusterPropertyCRD(t *testing.T) {
	crd, _ := readCRD(t, "about.k8s.io_clusterproperties.yaml")
	s := crd.Spec
	if crd.Name != ClusterPropertyGVR.Resource+"."+ClusterPropertyGVR.Group || s.Scope != apiextensionsv1.ClusterScoped ||
		s.Names.Kind != ClusterPropertyKind || len(s.Versions) != 2 {
		t.Fatalf("ClusterProperty CRD %s %+v", crd.Name, s)
	}
	if s.Conversion != nil && s.Conversion.Strategy != apiextensionsv1.NoneConverter {
		t.Errorf("conversion %+v, want none", s.Conversion)
	}
	versions := map[string]apiextensionsv1.CustomResourceDefinitionVersion{}
	for _, v := range s.Versions {
		versions[v.Name] = v
	}
	if v := versions["v1beta1"]; !v.Served || !v.Storage || v.Subresources == nil || v.Subresources.Status == nil {
		t.Errorf("v1beta1 %+v, want served, stored, with status", v)
	}
	if v := versions[ClusterPropertyGVR.Version]; ClusterPropertyGVR.Version != "v1alpha1" || !v.Served || v.Storage {
		t.Errorf("meshd reads %s: served %v, stored %v; want v1alpha1, served", ClusterPropertyGVR, v.Served, v.Storage)
	}
	var specs []apiextensionsv1.JSONSchemaProps
	for _, v := range s.Versions {
		spec := v.Schema.OpenAPIV3Schema.Properties["spec"]
		if spec.Properties["value"].Type != "string" || len(spec.Required) != 1 || spec.Required[0] != "value" {
			t.Errorf("%s: spec %+v, want a required string value", v.Name, spec)
		}
		specs = append(specs, spec)
	}
	if len(specs) == 2 && !reflect.DeepEqual(specs[0], specs[1]) {
		t.Errorf("the versions' spec schemas differ: %+v and %+v", specs[0], specs[1])
	}
}
