package wg

import "github.com/vishvananda/netns"

// unlessCurrentNS returns ns, or netns.None() when the calling OS thread
// is in ns already. Entering a network namespace (setns) needs
// CAP_SYS_ADMIN, which meshd does not have in the DaemonSet (NET_ADMIN and
// NET_RAW only), so "enter ns" must be skipped when it would be a no-op:
// netlink's ...At(ns) functions then open their sockets right here, which
// binds them to the same namespace. Go runs goroutines that are not locked
// to a thread only on threads that never left the process's namespace, so
// the answer holds for the calling goroutine until it switches namespaces
// itself.
func unlessCurrentNS(ns netns.NsHandle) netns.NsHandle {
	cur, err := netns.Get()
	if err != nil {
		return ns
	}
	defer cur.Close()
	if ns.IsOpen() && cur.Equal(ns) {
		return netns.None()
	}
	return ns
}

// setNS switches the calling (locked) OS thread into ns unless it is there.
func setNS(ns netns.NsHandle) error {
	if !unlessCurrentNS(ns).IsOpen() {
		return nil
	}
	return netns.Set(ns)
}

// nsOption is ns for netlink's subscribe options: nil (this namespace,
// without entering it) when the calling thread is in *ns already.
func nsOption(ns *netns.NsHandle) *netns.NsHandle {
	if ns == nil || !unlessCurrentNS(*ns).IsOpen() {
		return nil
	}
	return ns
}
