//go:build e2e

// Command e2etool is a small traffic helper for the e2e testbed, run inside
// pod namespaces:
//
//	e2etool serve ADDR            accept TCP connections; for each, read until
//	                              EOF and answer "<bytes> <sha256hex>\n"
//	e2etool send [-timeout D] ADDR BYTES
//	                              send BYTES pseudo-random bytes, half-close,
//	                              and check the answer; exit 1 on mismatch
//	e2etool http ADDR TEXT        serve HTTP: every request gets "TEXT\n"
//	e2etool linkload [-mode nodes|controller] [-n N] [-duration D] SECRET
//	                              the load of cluster links on a linked
//	                              cluster's API server (linkload.go)
//	e2etool wgfakes [-probe-port N] FILE
//	                              answer WireGuard handshakes and meshd's
//	                              probes for many fake nodes (wgfakes.go)
//
// Out of scope: checking results (the e2e tests do; e2etool only moves bytes
// and reports what it saw).
package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "serve":
		if len(os.Args) != 3 {
			usage()
		}
		serve(os.Args[2])
	case "send":
		fs := flag.NewFlagSet("send", flag.ExitOnError)
		timeout := fs.Duration("timeout", 10*time.Second, "overall timeout")
		_ = fs.Parse(os.Args[2:])
		if fs.NArg() != 2 {
			usage()
		}
		size, err := strconv.Atoi(fs.Arg(1))
		if err != nil {
			usage()
		}
		if err := send(fs.Arg(0), size, *timeout); err != nil {
			fmt.Fprintln(os.Stderr, "send:", err)
			os.Exit(1)
		}
	case "http":
		if len(os.Args) != 4 {
			usage()
		}
		text := os.Args[3] + "\n"
		log.Printf("serving HTTP on %s", os.Args[2])
		log.Fatal(http.ListenAndServe(os.Args[2], http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			log.Printf("HTTP %s %s from %s", r.Method, r.URL, r.RemoteAddr)
			_, _ = io.WriteString(w, text)
		})))
	case "linkload":
		linkLoad(os.Args[2:])
	case "wgfakes":
		if err := wgfakes(os.Args[2:]); err != nil {
			log.Fatal(err)
		}
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: e2etool serve ADDR | e2etool send [-timeout D] ADDR BYTES | e2etool http ADDR TEXT | e2etool linkload [-mode M] [-n N] [-duration D] SECRET | e2etool wgfakes [-probe-port N] FILE")
	os.Exit(2)
}

func serve(addr string) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("listening on %s", l.Addr())
	for {
		c, err := l.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go func(c net.Conn) {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(time.Minute))
			h := sha256.New()
			n, err := io.Copy(h, c)
			if err != nil {
				log.Printf("%s: read: %v", c.RemoteAddr(), err)
				return
			}
			fmt.Fprintf(c, "%d %s\n", n, hex.EncodeToString(h.Sum(nil)))
			log.Printf("%s: %d bytes", c.RemoteAddr(), n)
		}(c)
	}
}

func send(addr string, size int, timeout time.Duration) error {
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	h := sha256.New()
	r := rand.NewChaCha8([32]byte{1, 2, 3})
	buf := make([]byte, 64*1024)
	left := size
	for left > 0 {
		b := buf
		if left < len(b) {
			b = b[:left]
		}
		_, _ = r.Read(b)
		h.Write(b)
		if _, err := c.Write(b); err != nil {
			return fmt.Errorf("write after %d bytes: %w", size-left, err)
		}
		left -= len(b)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("reading answer: %w", err)
	}
	want := fmt.Sprintf("%d %s", size, hex.EncodeToString(h.Sum(nil)))
	if got := strings.TrimSpace(line); got != want {
		return fmt.Errorf("answer %q, want %q", got, want)
	}
	el := time.Since(start)
	fmt.Printf("sent %d bytes to %s in %s (%.1f Mbit/s)\n", size, addr, el.Round(time.Millisecond), float64(size)*8/el.Seconds()/1e6)
	return nil
}
