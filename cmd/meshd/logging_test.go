package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"meshd.io/meshd/pkg/k8s/convert"
)

// TestLogFormat: --log-format json writes one JSON object per line, text
// writes logfmt, and klog (client-go) lines go through the same logger and
// level filter.
func TestLogFormat(t *testing.T) {
	t.Cleanup(klog.ClearLogger)
	var b bytes.Buffer
	log := newLogger(&b, "info", "json")
	log.Info("hello", "node", "n1")
	klog.InfoS("from client-go", "resource", "nodes")
	klog.Error("reflector failed")
	log.Debug("hidden")
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 3 lines, got %q", b.String())
	}
	for i, want := range []map[string]string{
		{"msg": "hello", "node": "n1", "level": "INFO"},
		{"msg": "from client-go", "resource": "nodes", "level": "INFO"},
		{"msg": "reflector failed", "level": "ERROR"},
	} {
		var got map[string]any
		if err := json.Unmarshal([]byte(lines[i]), &got); err != nil {
			t.Fatalf("line %d %q is not JSON: %v", i, lines[i], err)
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("line %d: %s = %v, want %q (%s)", i, k, got[k], v, lines[i])
			}
		}
	}

	b.Reset()
	log = newLogger(&b, "warn", "text")
	log.Warn("plan", "warning", "x")
	klog.InfoS("filtered by the level")
	if got := b.String(); !strings.Contains(got, `level=WARN msg=plan warning=x`) || strings.Contains(got, "filtered") || strings.HasPrefix(got, "{") {
		t.Errorf("text output %q", got)
	}
}

// TestLogFormatFlag: every subcommand takes --log-format and refuses other
// values with exit code 2.
func TestLogFormatFlag(t *testing.T) {
	t.Cleanup(klog.ClearLogger)
	for _, sub := range [][]string{nil, {"device"}, {"cleanup"}, {"mirror"}, {"dns"}} {
		var out, errb bytes.Buffer
		args := append(append([]string{}, sub...), "--log-format", "xml")
		if code := realMain(args, &out, &errb); code != 2 || !strings.Contains(errb.String(), `--log-format "xml": want text or json`) {
			t.Errorf("meshd %v: exit %d, stderr %q", args, code, errb.String())
		}
	}
}

// TestPlanWarningsOnce: a plan warning is logged and raised as an Event on
// the node once while it persists, its resolution logged once, and a
// reappearance reported again.
func TestPlanWarningsOnce(t *testing.T) {
	ctx := context.Background()
	// b1's allowed-location-ips overlap a1's pod CIDR: the planner drops
	// the range and warns.
	b1 := testNode("b1", "b", "198.51.100.21", "10.42.3.0/24", newKey(t))
	b1.Annotations[convert.AnnotationAllowedLocationIPs] = "10.42.1.0/25"
	f := newFakes(t, "a1",
		testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", newKey(t)),
		b1,
	)
	var logs bytes.Buffer
	f.rec.log = slog.New(slog.NewTextHandler(&logs, nil))
	events := record.NewFakeRecorder(100)
	f.rec.events = events
	drain := func() []string {
		var out []string
		for {
			select {
			case e := <-events.Events:
				out = append(out, e)
			default:
				return out
			}
		}
	}
	for i := 0; i < 3; i++ {
		if err := f.rec.reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		f.refresh(t)
	}
	if n := strings.Count(logs.String(), "msg=plan warning="); n != 1 {
		t.Fatalf("warning logged %d times over 3 reconciles, want 1:\n%s", n, logs.String())
	}
	ev := drain()
	if len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning PlanWarning ") || !strings.Contains(ev[0], "10.42.1.0/25") {
		t.Fatalf("events %q, want one PlanWarning naming the range", ev)
	}

	setAnnotation := func(v string) {
		n, err := f.kube.CoreV1().Nodes().Get(ctx, "b1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if v == "" {
			delete(n.Annotations, convert.AnnotationAllowedLocationIPs)
		} else {
			n.Annotations[convert.AnnotationAllowedLocationIPs] = v
		}
		if _, err := f.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.refresh(t)
	}
	logs.Reset()
	setAnnotation("")
	for i := 0; i < 2; i++ {
		if err := f.rec.reconcile(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), `msg="plan warning resolved"`); n != 1 || strings.Contains(logs.String(), "msg=plan ") {
		t.Fatalf("resolution logged %d times, want 1:\n%s", n, logs.String())
	}
	if ev := drain(); len(ev) != 0 {
		t.Errorf("events without a new warning: %q", ev)
	}
	setAnnotation("10.42.1.0/25")
	if err := f.rec.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := drain(); len(ev) != 1 {
		t.Errorf("reappeared warning: events %q, want 1", ev)
	}
}
