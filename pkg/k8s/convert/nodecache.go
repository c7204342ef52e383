package convert

import (
	"maps"
	"net/netip"
	"slices"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"

	"meshd.io/meshd/pkg/mesh"
)

// NodeCache converts Node objects for the planner (NewMeshInput with
// MeshInputOptions.Nodes) and keeps each result for the next conversion, so
// that a reconcile parses only the Nodes that changed: at 1,000 nodes, each
// listing the discovered endpoints of 64 peers, parsing every Node took
// 80-160 ms and made 34 MB of garbage per reconcile. An informer replaces an
// object when it changes and never edits it, so an object seen before (the
// same pointer) with the same resourceVersion converts the same; one
// without a resourceVersion is always parsed.
//
// Of each Node's DiscoveredEndpoints it keeps only what the plan reads: the
// endpoints of nodes that use them (mesh.UsesDiscoveredEndpoint). The others
// only tell meshctl of a recent handshake, and at 1,000 nodes in full mesh
// they are 64,000 entries (10 MB) that the plan never looks at. When the
// set of nodes using discovered endpoints changes, every Node is parsed
// again.
//
// Results are handed out as copies, except for DiscoveredEndpoints: that map
// is shared between the conversions of an unchanged Node and must not be
// modified (nothing does: mesh.Build never modifies its input, as its fuzz
// test checks). The zero value is ready; it is not safe for concurrent use
// (one reconcile at a time).
type NodeCache struct {
	opts    ParseOptions
	entries map[*corev1.Node]nodeCacheEntry
	// needed are the keys of the nodes using discovered endpoints as of the
	// last conversion: the keys every entry's DiscoveredEndpoints is cut to.
	needed map[wgtypes.Key]bool
	// Parsed is how many Nodes the last conversion parsed (the others came
	// from the cache).
	Parsed int
}

type nodeCacheEntry struct {
	rv       string
	node     mesh.Node
	problems []error
}

// convert converts the non-nil objs like NodeFromObject with o, in order,
// each Node's DiscoveredEndpoints cut to the nodes that use them; problems
// are each Node's, by index.
func (c *NodeCache) convert(objs []*corev1.Node, o ParseOptions) (nodes []mesh.Node, problems [][]error) {
	if c.opts != o {
		c.entries = nil
	}
	c.opts, c.Parsed = o, 0
	type conv struct {
		obj   *corev1.Node
		entry nodeCacheEntry
		hit   bool
	}
	convs := make([]conv, 0, len(objs))
	for _, obj := range objs {
		if obj == nil {
			continue
		}
		if e, ok := c.entries[obj]; ok && obj.ResourceVersion != "" && e.rv == obj.ResourceVersion {
			convs = append(convs, conv{obj: obj, entry: e, hit: true})
			continue
		}
		c.Parsed++
		n, p := NodeFromObject(obj, o)
		convs = append(convs, conv{obj: obj, entry: nodeCacheEntry{rv: obj.ResourceVersion, node: n, problems: p}})
	}
	needed := map[wgtypes.Key]bool{}
	for i := range convs {
		if n := &convs[i].entry.node; mesh.UsesDiscoveredEndpoint(n) {
			needed[n.PublicKey] = true
		}
	}
	reparse := !maps.Equal(needed, c.needed)
	c.needed = needed
	next := make(map[*corev1.Node]nodeCacheEntry, len(convs))
	nodes, problems = make([]mesh.Node, 0, len(convs)), make([][]error, 0, len(convs))
	for _, cv := range convs {
		e := cv.entry
		if cv.hit && reparse { // cut to other keys: parse it again
			c.Parsed++
			e.node, e.problems = NodeFromObject(cv.obj, o)
			cv.hit = false
		}
		if !cv.hit {
			e.node.DiscoveredEndpoints = cutDiscovered(e.node.DiscoveredEndpoints, needed)
		}
		if e.rv != "" {
			next[cv.obj] = e
		}
		nodes = append(nodes, e.share())
		problems = append(problems, slices.Clone(e.problems))
	}
	c.entries = next
	return nodes, problems
}

// cutDiscovered keeps the entries of eps whose key is needed (nil when none).
func cutDiscovered(eps map[wgtypes.Key]netip.AddrPort, needed map[wgtypes.Key]bool) map[wgtypes.Key]netip.AddrPort {
	var out map[wgtypes.Key]netip.AddrPort
	for k, ap := range eps {
		if needed[k] {
			if out == nil {
				out = map[wgtypes.Key]netip.AddrPort{}
			}
			out[k] = ap
		}
	}
	return out
}

// share is a copy of the entry's Node with its DiscoveredEndpoints shared.
func (e *nodeCacheEntry) share() mesh.Node {
	n := e.node
	n.DiscoveredEndpoints = nil
	n = n.Clone()
	n.DiscoveredEndpoints = e.node.DiscoveredEndpoints
	return n
}
