package liveness

import (
	"maps"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestJudgeClusters(t *testing.T) {
	live := map[string]bool{"a": true, "b": true, "c": true}
	for _, tc := range []struct {
		name    string
		live    map[string]bool
		reports map[string]Report
		want    map[string]bool
	}{
		{"nobody reports: unknown", live, map[string]Report{"a": {Up: []string{"b"}}}, map[string]bool{}},
		{"one leader says down", live, map[string]Report{"a": {ClustersDown: []string{"c2"}, ClustersUp: []string{"c3"}}}, map[string]bool{"c2": false, "c3": true}},
		{"tie keeps up", live, map[string]Report{"a": {ClustersDown: []string{"c2"}}, "b": {ClustersUp: []string{"c2"}}}, map[string]bool{"c2": true}},
		{"majority down", live, map[string]Report{"a": {ClustersDown: []string{"c2"}}, "b": {ClustersDown: []string{"c2"}}, "c": {ClustersUp: []string{"c2"}}}, map[string]bool{"c2": false}},
		{"a stale Lease does not vote", map[string]bool{"b": true}, map[string]Report{"a": {ClustersDown: []string{"c2"}}, "b": {ClustersUp: []string{"c2"}}}, map[string]bool{"c2": true}},
		{"only a stale Lease: unknown", map[string]bool{}, map[string]Report{"a": {ClustersDown: []string{"c2"}}}, map[string]bool{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := JudgeClusters(tc.live, tc.reports); !maps.Equal(got, tc.want) {
				t.Errorf("JudgeClusters = %v, want %v", got, tc.want)
			}
		})
	}
}

// The tunnel report round-trips through the Lease annotations; empty lists
// remove their annotation.
func TestClusterReportAnnotations(t *testing.T) {
	r := Report{Up: []string{"n2"}, ClustersUp: []string{"c3"}, ClustersDown: []string{"c2", "c4"}}
	a := ReportAnnotations(r)
	if a[AnnotationClustersDown] != "c2,c4" || a[AnnotationClustersUp] != "c3" || a[AnnotationProbeDown] != "" {
		t.Fatalf("annotations %v", a)
	}
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Annotations: a}}
	if got := ReportFromLease(l); !got.equal(r) {
		t.Errorf("round trip: %+v, want %+v", got, r)
	}
}
