// Command e2e-kernel-proxy forwards TCP connections accepted in the network
// namespace it starts in to an address dialled in another network namespace.
//
// make e2e-kernel (hack/e2e-kernel.sh) runs the e2e testbed inside a qemu
// guest, where emulation makes kube-apiserver far too slow; the API server
// runs on the host instead, and this proxy, started by the testbed as its
// "kube-apiserver" inside the control-plane namespace, forwards
// 203.0.113.2:6443 to the host through the guest's own (root) namespace.
//
//	e2e-kernel-proxy -listen 0.0.0.0:6443 -netns /proc/1/ns/net -to 10.0.2.2:6443
//
// Out of scope: anything but plain TCP forwarding; it is test tooling, never
// shipped.
package main

import (
	"flag"
	"io"
	"log"
	"net"
	"runtime"
	"time"

	"github.com/vishvananda/netns"
)

func main() {
	listen := flag.String("listen", "0.0.0.0:6443", "address to listen on (in the current network namespace)")
	to := flag.String("to", "", "address to forward to")
	nsPath := flag.String("netns", "/proc/1/ns/net", "network namespace to dial -to in")
	flag.Parse()
	if *to == "" {
		log.Fatal("-to is required")
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	// One OS thread lives in the target namespace and makes every outgoing
	// connection (a socket stays in the namespace it was created in).
	type dialResult struct {
		c   net.Conn
		err error
	}
	dials := make(chan chan dialResult)
	ready := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread stays in the namespace
		ns, err := netns.GetFromPath(*nsPath)
		if err == nil {
			err = netns.Set(ns)
		}
		ready <- err
		for r := range dials {
			c, err := net.DialTimeout("tcp", *to, 10*time.Second)
			r <- dialResult{c, err}
		}
	}()
	if err := <-ready; err != nil {
		log.Fatalf("entering %s: %v", *nsPath, err)
	}
	log.Printf("forwarding %s to %s (dialled in %s)", *listen, *to, *nsPath)
	for {
		in, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		r := make(chan dialResult)
		dials <- r
		res := <-r
		if res.err != nil {
			log.Printf("dial %s: %v", *to, res.err)
			in.Close()
			continue
		}
		go pipe(in, res.c)
	}
}

func pipe(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
	a.Close()
	b.Close()
}
