// Package mcsdns answers DNS for the Multi-Cluster Services API (KEP-1645)
// under clusterset.local: a CoreDNS plugin (Handler) that reads
// multicluster.x-k8s.io/v1beta1 ServiceImports and the EndpointSlices
// labelled multicluster.kubernetes.io/service-name from informer caches, and
// a Server that runs it inside CoreDNS's own dnsserver (CoreDNS embedded as a
// library, with no Corefile and no other plugin).
//
// Names, following the MCS DNS specification and the kubernetes plugin:
//
//   - <svc>.<ns>.svc.<zone> A/AAAA: a ClusterSetIP import's spec.ips; a
//     Headless import's ready endpoint addresses of every source cluster.
//   - _<port>._<proto>.<svc>.<ns>.svc.<zone> SRV: one record per named port
//     (ClusterSetIP: target the service name), per ready endpoint (Headless:
//     target <host>.<cluster>.<svc>.<ns>.svc.<zone> and the endpoint's port),
//     with the targets' addresses in the additional section.
//   - <host>.<cluster>.<svc>.<ns>.svc.<zone> A/AAAA (Headless only): the
//     endpoint of source cluster <cluster> whose hostname is <host>, or,
//     without a hostname, whose address written with dashes is <host>.
//
// A name that exists without records of the asked type is NODATA, any other
// name in the zone NXDOMAIN (both with the zone's SOA), a name outside the
// zone REFUSED, and every query SERVFAIL until the caches have synced.
//
// Out of scope: writing anything. The ServiceImports and EndpointSlices are
// the MCS controller's (meshd mirror); this package never calls the API
// server per query, serves no reverse (PTR) zone, no wildcard names, no
// zone transfers and no other zone, and forwards nothing: a cluster's own
// CoreDNS forwards clusterset.local here (docs/mcs-dns.md). It uses no
// executor and no other meshd package.
package mcsdns
