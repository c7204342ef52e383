package convert

import (
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

func fatNode(rv string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "w1", UID: "uid-1", ResourceVersion: rv,
			Labels:        map[string]string{"topology.kubernetes.io/region": "west"},
			Annotations:   map[string]string{AnnotationLocation: "west", "node.alpha.kubernetes.io/ttl": "0"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec: corev1.NodeSpec{PodCIDR: "10.42.1.0/24", PodCIDRs: []string{"10.42.1.0/24"}},
		Status: corev1.NodeStatus{
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.11"}},
			Images:     []corev1.ContainerImage{{Names: []string{"registry.example/big:1"}, SizeBytes: 1 << 30}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
}

func lean(t *testing.T, n *corev1.Node) *corev1.Node {
	t.Helper()
	o, err := LeanNode(n)
	if err != nil {
		t.Fatal(err)
	}
	return o.(*corev1.Node)
}

// TestSameLeanNode: a kubelet heartbeat (a new resourceVersion, new
// conditions) leaves the lean Node the same; a change of what meshd reads
// does not.
func TestSameLeanNode(t *testing.T) {
	base := lean(t, fatNode("1"))
	if base.ManagedFields != nil || base.Status.Images != nil || base.Status.Conditions != nil {
		t.Fatalf("LeanNode keeps what meshd never reads: %+v", base)
	}
	if _, ok := base.Annotations["node.alpha.kubernetes.io/ttl"]; ok {
		t.Fatal("LeanNode keeps another component's annotation")
	}
	heartbeat := fatNode("2")
	heartbeat.Status.Conditions[0].LastHeartbeatTime = metav1.Now()
	heartbeat.Annotations["node.alpha.kubernetes.io/ttl"] = "30"
	if !SameLeanNode(base, lean(t, heartbeat)) {
		t.Error("a heartbeat changes the lean Node")
	}
	for name, change := range map[string]func(*corev1.Node){
		"meshd annotation": func(n *corev1.Node) { n.Annotations[AnnotationLeader] = "true" },
		"label":            func(n *corev1.Node) { n.Labels["topology.kubernetes.io/region"] = "east" },
		"pod CIDR":         func(n *corev1.Node) { n.Spec.PodCIDRs = []string{"10.42.2.0/24"} },
		"address":          func(n *corev1.Node) { n.Status.Addresses[0].Address = "192.0.2.12" },
		"deletion":         func(n *corev1.Node) { now := metav1.Now(); n.DeletionTimestamp = &now },
		"recreated":        func(n *corev1.Node) { n.UID = "uid-2" },
	} {
		n := fatNode("3")
		change(n)
		if SameLeanNode(base, lean(t, n)) {
			t.Errorf("%s: the lean Nodes compare the same", name)
		}
	}
}

// TestDropManagedFields: managedFields go from any object; a tombstone
// passes unchanged.
func TestDropManagedFields(t *testing.T) {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n1", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "meshd"}}}}
	o, err := DropManagedFields(l)
	if err != nil || o.(*coordinationv1.Lease).ManagedFields != nil {
		t.Errorf("Lease after the transform: %+v, %v", o, err)
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "n1", Obj: l}
	if o, err := DropManagedFields(tomb); err != nil || o != any(tomb) {
		t.Errorf("tombstone after the transform: %+v, %v", o, err)
	}
	if o, err := LeanNode(tomb); err != nil || o != any(tomb) {
		t.Errorf("tombstone after LeanNode: %+v, %v", o, err)
	}
}
