package liveness

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// The probe report goes out with the renewals; a trigger with a new report
// writes at once, one with nothing new writes nothing (the idle write rate
// stays one per interval); each write's result is passed on.
func TestHeartbeatReport(t *testing.T) {
	c := fake.NewClientset()
	var mu sync.Mutex
	writes := 0
	fail := false
	c.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetVerb() != "create" && a.GetVerb() != "update" {
			return false, nil, nil
		}
		mu.Lock()
		defer mu.Unlock()
		writes++
		if fail {
			return true, nil, errors.New("API server unreachable")
		}
		return false, nil, nil
	})
	report := Report{Up: []string{"a"}}
	var results []error
	trigger := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- RunHeartbeatWith(ctx, c, HeartbeatOptions{Node: "n1", Interval: time.Hour, Trigger: trigger, MinGap: time.Millisecond,
			Report: func() Report { mu.Lock(); defer mu.Unlock(); return report },
			Result: func(err error) { mu.Lock(); defer mu.Unlock(); results = append(results, err) }})
	}()
	get := func() Report {
		l, err := c.CoordinationV1().Leases(DefaultNamespace).Get(context.Background(), "meshd-n1", metav1.GetOptions{})
		if err != nil {
			return Report{}
		}
		return ReportFromLease(l)
	}
	waitFor := func(what string, f func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !f() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return writes }
	waitFor("the first report", func() bool { r := get(); return len(r.Up) == 1 && r.Up[0] == "a" })
	waitFor("the first result", func() bool { mu.Lock(); defer mu.Unlock(); return len(results) == 1 })
	n := count()
	trigger <- struct{}{}
	time.Sleep(100 * time.Millisecond)
	if count() != n {
		t.Errorf("a trigger with an unchanged report wrote the Lease (%d writes, want %d)", count(), n)
	}
	mu.Lock()
	report = Report{Up: []string{"b"}, Down: []string{"a"}}
	mu.Unlock()
	trigger <- struct{}{}
	waitFor("the new report", func() bool { r := get(); return len(r.Down) == 1 && r.Down[0] == "a" && r.Up[0] == "b" })
	mu.Lock()
	fail = true
	report = Report{}
	mu.Unlock()
	trigger <- struct{}{}
	waitFor("a failed write reported", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(results) >= 3 && results[len(results)-1] != nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
