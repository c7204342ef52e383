package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"

	"meshd.io/meshd/pkg/mirror"
)

// controllerRun is what the cluster-wide controllers (`meshd mirror`,
// `meshd link`) share: a metrics and health listener, and one function run
// under a leader Lease (or directly, without election), until ctx ends.
type controllerRun struct {
	log    *slog.Logger
	listen string
	reg    *prometheus.Registry
	kube   kubernetes.Interface // holds the leader Lease
	// election is the leader Lease; nil runs once without election.
	election *mirror.LeaderElection
	once     func(context.Context) error
}

// run serves /metrics and /healthz and runs c.once (as leader when elected).
func (c controllerRun) run(ctx context.Context) error {
	srv := controllerServer(c.listen, c.reg)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var g run.Group
	g.Add(func() error {
		c.log.Info("serving metrics", "listen", c.listen)
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serving %s: %w", c.listen, err)
		}
		return nil
	}, func(error) {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		_ = srv.Shutdown(sctx)
	})
	g.Add(func() error {
		if c.election == nil {
			return c.once(ctx)
		}
		return mirror.RunLeaderElected(ctx, c.log, c.kube, *c.election, c.once)
	}, func(error) { cancel() })
	if err := g.Run(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// controllerServer serves /metrics from reg and /healthz on listen.
func controllerServer(listen string, reg *prometheus.Registry) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	return &http.Server{Addr: listen, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
}

// leaderIdentity names this replica in the leader Lease: the pod's name,
// else the host name plus a random suffix.
func leaderIdentity() string {
	if id := os.Getenv("POD_NAME"); id != "" {
		return id
	}
	host, _ := os.Hostname()
	return host + "_" + string(uuid.NewUUID())
}
