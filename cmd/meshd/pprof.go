package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"time"
)

// pprofServer returns the opt-in profiling listener of --debug-pprof: the
// net/http/pprof handlers on a mux of their own (never the metrics
// listener, never http.DefaultServeMux), so profiles are served only where
// the operator asked for them.
func pprofServer(addr string) *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
}

// servePprof runs the profiling listener until ctx ends; a listener that
// cannot start is logged and the daemon runs on without it.
func servePprof(ctx context.Context, log *slog.Logger, addr string) error {
	srv := pprofServer(addr)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Warn("serving Go profiles (--debug-pprof); never expose this address beyond the node", "listen", addr)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("cannot serve Go profiles; running without them", "listen", addr, "error", fmt.Errorf("serving %s: %w", addr, err))
	}
	<-ctx.Done()
	return nil
}
