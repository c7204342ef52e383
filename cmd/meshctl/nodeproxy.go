package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"meshd.io/meshd/pkg/k8s/connect"
	"meshd.io/meshd/pkg/nodestate"
)

// Reaching a node's meshd: diagnose and check read meshd's HTTP endpoints
// (--listen: /metrics and the debug state, pkg/nodestate) through the API
// server's node proxy, /api/v1/nodes/http:NODE:PORT/proxy/PATH. It needs
// RBAC "get nodes/proxy" (cluster-admin has it) and an API server that
// reaches the node's address at PORT: the DaemonSet listens on the node's
// own address (status.hostIP); a meshd listening on 127.0.0.1 only is not
// reachable from off the node.

// defaultMeshdPort is meshd's --listen port in the manifests.
const defaultMeshdPort = 9477

// nodeGetter fetches PATH?query from meshd on node at port; it returns the
// body even with an HTTP error status (then err is set too).
type nodeGetter func(ctx context.Context, c *connect.Clients, node string, port int, path string, query url.Values) ([]byte, error)

// nodeProxyGet is the nodeGetter through the API server's node proxy.
func nodeProxyGet(ctx context.Context, c *connect.Clients, node string, port int, path string, query url.Values) ([]byte, error) {
	req := c.Kube.CoreV1().RESTClient().Get().
		AbsPath("/api/v1/nodes", "http:"+node+":"+strconv.Itoa(port), "proxy", strings.TrimPrefix(path, "/"))
	for k, vs := range query {
		for _, v := range vs {
			req = req.Param(k, v)
		}
	}
	body, err := req.Do(ctx).Raw()
	if err != nil {
		var se apierrors.APIStatus
		switch {
		case apierrors.IsForbidden(err):
			return body, fmt.Errorf("node %s: the API server's node proxy is forbidden (meshctl needs get nodes/proxy): %w", node, err)
		case errors.As(err, &se) && len(body) > 0 && body[0] == '{':
			var st metav1.Status
			if json.Unmarshal(body, &st) != nil || st.Kind != "Status" || st.Message == "" {
				// meshd's own answer (its body tells more).
				return body, fmt.Errorf("node %s: %s: HTTP %d", node, path, se.Status().Code)
			}
			// The API server's answer: the node proxy could not reach meshd
			// (503, "error trying to reach service: dial tcp ...: connection
			// refused") or refused the request.
			if st.Code == http.StatusServiceUnavailable || st.Reason == metav1.StatusReasonServiceUnavailable {
				return body, fmt.Errorf("node %s: meshd is not reachable on %s:%d (not running?): HTTP 503: %s", node, node, port, st.Message)
			}
			return body, fmt.Errorf("node %s: %s: HTTP %d from the API server's node proxy: %s", node, path, se.Status().Code, st.Message)
		}
		return body, fmt.Errorf("node %s: reaching meshd at port %d through the API server's node proxy: %w", node, port, err)
	}
	return body, nil
}

// meshdPort is the port meshd on node listens on: --meshd-port, else what
// the node publishes, else the manifests' 9477. A meshd listening on
// loopback only is an error that says so.
func meshdPort(m *model, node string, flag int) (int, error) {
	if flag > 0 {
		return flag, nil
	}
	s, ok := m.Published.ByNode[node]
	if !ok {
		return defaultMeshdPort, nil
	}
	if s.ListenLoopback {
		return 0, fmt.Errorf("meshd on node %s listens on a loopback address only (its --listen): the API server cannot reach it; run meshd with --listen $(HOST_IP):%d as manifests/ do", node, s.ListenPort)
	}
	if s.ListenPort > 0 {
		return s.ListenPort, nil
	}
	return defaultMeshdPort, nil
}

// fetchState reads node's debug state.
func (e *env) fetchState(ctx context.Context, c *connect.Clients, m *model, node string, port int) (*nodestate.State, error) {
	p, err := meshdPort(m, node, port)
	if err != nil {
		return nil, err
	}
	body, err := e.getter()(ctx, c, node, p, nodestate.PathState, nil)
	if err != nil {
		return nil, err
	}
	var s nodestate.State
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, fmt.Errorf("node %s: reading meshd's debug state (is meshd older than meshctl?): %w", node, err)
	}
	return &s, nil
}

// ping asks meshd on from to send count ICMP echo requests from its mesh
// address to addr, through the mesh.
func (e *env) ping(ctx context.Context, c *connect.Clients, m *model, from string, port int, addr string, count int) (nodestate.Ping, error) {
	p, err := meshdPort(m, from, port)
	if err != nil {
		return nodestate.Ping{}, err
	}
	body, gerr := e.getter()(ctx, c, from, p, nodestate.PathPing, url.Values{"to": {addr}, "count": {strconv.Itoa(count)}})
	var out nodestate.Ping
	if err := json.Unmarshal(body, &out); err != nil || out.From == "" && out.Error == "" {
		if gerr != nil {
			return out, gerr
		}
		if err == nil {
			err = errors.New("an empty answer")
		}
		return out, fmt.Errorf("node %s: reading meshd's ping answer: %w", from, err)
	}
	return out, nil
}

func (e *env) getter() nodeGetter {
	if e.nodeGet == nil {
		return nodeProxyGet
	}
	return e.nodeGet
}
