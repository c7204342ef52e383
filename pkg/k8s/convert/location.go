package convert

import "meshd.io/meshd/pkg/mesh"

// LocationKeys maps every node to the key of the segment it belongs to, as
// Judge wants it: "location/<location>", or "node/<name>" for a node without
// a location or in a full mesh (a segment of its own).
func LocationKeys(nodes []mesh.Node, g mesh.Granularity) map[string]string {
	out := make(map[string]string, len(nodes))
	for _, n := range nodes {
		out[n.Name] = LocationKey(n, g)
	}
	return out
}

// LocationKey is one node's LocationKeys entry.
func LocationKey(n mesh.Node, g mesh.Granularity) string {
	if n.Location == "" || g == mesh.GranularityFull {
		return "node/" + n.Name
	}
	return "location/" + n.Location
}
