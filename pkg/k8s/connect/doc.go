// Package connect builds what meshd and meshctl use to talk to an API
// server: the core and meshd.io clientsets from a kubeconfig or the
// in-cluster configuration (Clients), the Peer informer and the event
// recorder.
//
// Out of scope: the Peer API types (pkg/k8s/apis/meshd/v1alpha1) and the
// generated clientset, listers and informers (pkg/k8s/client; run
// hack/update-codegen.sh after changing the types), and what is done with
// the objects (pkg/k8s/convert, pkg/k8s/liveness, pkg/k8s).
package connect
