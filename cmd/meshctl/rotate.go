package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"meshd.io/meshd/pkg/k8s/convert"
)

func newRotateKeyCommand(e *env) *cobra.Command {
	var (
		wait    bool
		timeout time.Duration
	)
	c := &cobra.Command{
		Use:   "rotate-key NODE",
		Short: "Rotate a node's WireGuard key without losing traffic",
		Long: `Asks meshd on NODE to rotate its WireGuard key: sets the annotation
meshd.io/rotate-key on the Node to a new value (the current time). meshd stores
the next key beside the current one, publishes it as meshd.io/next-public-key,
then switches to it and publishes it as meshd.io/public-key; every other node
replaces the old key's peer by the new one as soon as it sees it. The old
private key is deleted; the old public key leaves every Node and every
WireGuard device. See docs/security.md ("Key rotation").

With --wait (the default) meshctl waits until NODE reports the rotation done
(meshd.io/rotated-key equals the request) and prints the old and the new
public key; exit code 1 if that takes longer than --timeout (the request
stays: meshd completes it when it can).`,
		Example: `  meshctl rotate-key node-1
  kubectl annotate node node-1 --overwrite meshd.io/rotate-key="$(date -u +%FT%TZ)"`,
		Args: exactArgs("NODE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return e.rotateKey(cmd.Context(), args[0], wait, timeout)
		},
	}
	c.Flags().BoolVar(&wait, "wait", true, "wait until the node reports the rotation done")
	c.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long --wait waits")
	return c
}

func (e *env) rotateKey(ctx context.Context, name string, wait bool, timeout time.Duration) error {
	if ctx == nil {
		ctx = context.Background()
	}
	c, err := e.newClients(e.s.kubeconfig, e.s.context)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, e.s.timeout)
	defer cancel()
	n, err := c.Kube.CoreV1().Nodes().Get(rctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("node %q not found", name)
	}
	if err != nil {
		return fmt.Errorf("reading node %s: %w", name, err)
	}
	old := n.Annotations[convert.AnnotationPublicKey]
	if old == "" {
		return fmt.Errorf("node %s has no %s: meshd has not published a key there (is it running on that node?)", name, convert.AnnotationPublicKey)
	}
	request := e.now().UTC().Format(time.RFC3339Nano)
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{convert.AnnotationRotateKey: request}}})
	if _, err := c.Kube.CoreV1().Nodes().Patch(rctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "meshctl"}); err != nil {
		return fmt.Errorf("requesting the key rotation on node %s: %w", name, err)
	}
	if !wait {
		fmt.Fprintf(e.stdout, "key rotation requested on node %s (%s=%s)\n", name, convert.AnnotationRotateKey, request)
		return nil
	}
	interval := e.pollInterval
	if interval == 0 {
		interval = 250 * time.Millisecond
	}
	wctx, wcancel := context.WithTimeout(ctx, timeout)
	defer wcancel()
	for {
		n, err := c.Kube.CoreV1().Nodes().Get(wctx, name, metav1.GetOptions{})
		if err == nil && n.Annotations[convert.AnnotationRotatedKey] == request {
			fmt.Fprintf(e.stdout, "node %s rotated its WireGuard key: public key %s replaces %s\n", name, n.Annotations[convert.AnnotationPublicKey], old)
			return nil
		}
		select {
		case <-wctx.Done():
			why := "meshd on the node has not completed it"
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				why = err.Error()
			}
			return fmt.Errorf("key rotation requested on node %s (%s=%s) but not done within %s: %s; the request stays and meshd completes it when it can (see its log)", name, convert.AnnotationRotateKey, request, timeout, why)
		case <-time.After(interval):
		}
	}
}
