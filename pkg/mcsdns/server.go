package mcsdns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	"github.com/miekg/dns"
)

// Server serves a Handler over UDP and TCP on one address through CoreDNS's
// dnsserver (its zone routing, EDNS checks, truncation of large UDP answers
// and panic recovery), with metrics of every answer.
type Server struct {
	core    *dnsserver.Server
	udp     net.PacketConn
	tcp     net.Listener
	metrics *Metrics
	log     *slog.Logger
}

// Listen binds addr (host:port) on UDP and TCP for h. The zone served is
// the root: h itself refuses names outside its zone, so those answers are
// counted too.
func Listen(addr string, h plugin.Handler, m *Metrics, log *slog.Logger) (*Server, error) {
	cfg := &dnsserver.Config{Zone: ".", Plugin: []plugin.Plugin{func(plugin.Handler) plugin.Handler { return h }}}
	core, err := dnsserver.NewServer("dns://"+addr, []*dnsserver.Config{cfg})
	if err != nil {
		return nil, err
	}
	udp, err := net.ListenPacket("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("DNS on UDP %s: %w", addr, err)
	}
	// TCP on the same port as UDP (addr may ask for port 0).
	tcp, err := net.Listen("tcp", udp.LocalAddr().String())
	if err != nil {
		udp.Close()
		return nil, fmt.Errorf("DNS on TCP %s: %w", udp.LocalAddr(), err)
	}
	return &Server{core: core, udp: udp, tcp: tcp, metrics: m, log: log}, nil
}

// Addr is the bound address (UDP and TCP).
func (s *Server) Addr() string { return s.udp.LocalAddr().String() }

// Run serves until ctx ends, then shuts the listeners down.
func (s *Server) Run(ctx context.Context) error {
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		rw := &recorder{ResponseWriter: w, start: time.Now(), metrics: s.metrics}
		c := context.WithValue(context.Background(), dnsserver.Key{}, s.core)
		c = context.WithValue(c, dnsserver.LoopKey{}, 0)
		s.core.ServeDNS(c, rw, r)
	})
	servers := []*dns.Server{
		{PacketConn: s.udp, Net: "udp", Handler: handler},
		{Listener: s.tcp, Net: "tcp", Handler: handler, ReadTimeout: 3 * time.Second, WriteTimeout: 5 * time.Second,
			IdleTimeout: func() time.Duration { return 10 * time.Second }},
	}
	errc := make(chan error, len(servers))
	for _, srv := range servers {
		go func() { errc <- srv.ActivateAndServe() }()
	}
	s.log.Info("serving DNS", "addr", s.Addr())
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, srv := range servers {
		if e := srv.ShutdownContext(sctx); e != nil && err == nil && !errors.Is(e, context.DeadlineExceeded) {
			s.log.Debug("DNS shutdown", "error", e)
		}
	}
	// A server shut down before it had started keeps serving until its
	// listener closes.
	s.Close()
	return err
}

// Close releases the listeners of a Server that never ran.
func (s *Server) Close() {
	s.udp.Close()
	s.tcp.Close()
}

// recorder counts a request in the metrics, by the rcode of its answer.
type recorder struct {
	dns.ResponseWriter
	start   time.Time
	metrics *Metrics
	counted bool // a request counts once, however often its answer is written
}

// WriteMsg counts the answer before it is sent, so a client that has its
// answer finds it in the metrics.
func (r *recorder) WriteMsg(m *dns.Msg) error {
	if !r.counted {
		r.counted = true
		r.metrics.observe(m.Rcode, time.Since(r.start).Seconds())
	}
	return r.ResponseWriter.WriteMsg(m)
}
