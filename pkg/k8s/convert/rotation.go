package convert

// Key rotation annotations (docs/security.md, "Key rotation"). The first is
// set by the operator (or `meshctl rotate-key NODE`), the others by meshd on
// its own Node while it rotates its WireGuard key.
const (
	// AnnotationRotateKey requests a rotation of the node's WireGuard key:
	// any new value (a nonce; meshctl writes the time) starts one.
	AnnotationRotateKey = AnnotationPrefix + "rotate-key"
	// AnnotationNextPublicKey is the public key the node switches to, from
	// the moment its next private key is stored until the switch (set by
	// meshd).
	AnnotationNextPublicKey = AnnotationPrefix + "next-public-key"
	// AnnotationRotatedKey is the value of meshd.io/rotate-key whose rotation
	// the node completed (set by meshd): equal values mean done.
	AnnotationRotatedKey = AnnotationPrefix + "rotated-key"
)
