package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"meshd.io/meshd/pkg/k8s/connect"
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
	server := "the API server"
	if c.Config != nil && c.Config.Host != "" {
		server = c.Config.Host
	}
	rctx, cancel := context.WithTimeout(ctx, e.s.timeout)
	defer cancel()
	n, err := c.Kube.CoreV1().Nodes().Get(rctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return unknownNode(rctx, c, name)
	}
	if err != nil {
		return rotateAPIError(err, "reading node "+name, server)
	}
	old := n.Annotations[convert.AnnotationPublicKey]
	if old == "" {
		return fmt.Errorf("node %s has no %s: meshd has not published a key there (is it running on that node?)", name, convert.AnnotationPublicKey)
	}
	request := e.now().UTC().Format(time.RFC3339Nano)
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{convert.AnnotationRotateKey: request}}})
	if _, err := c.Kube.CoreV1().Nodes().Patch(rctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "meshctl"}); err != nil {
		return rotateAPIError(err, "requesting the key rotation on node "+name, server)
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
				why = rotateAPIError(err, "reading node "+name, server).Error()
			}
			return fmt.Errorf("key rotation requested on node %s (%s=%s) but not done within %s: %s; the request stays and meshd completes it when it can (see its log)", name, convert.AnnotationRotateKey, request, timeout, why)
		case <-time.After(interval):
		}
	}
}

// unknownNode is the error for a node the API server does not know: it
// names the known ones, as the commands that read the whole cluster do.
func unknownNode(ctx context.Context, c *connect.Clients, name string) error {
	nl, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("node %q not found", name)
	}
	names := make([]string, 0, len(nl.Items))
	for _, n := range nl.Items {
		names = append(names, n.Name)
	}
	slices.Sort(names)
	return unknown("node", name, names)
}

// rotateAPIError is apiError for rotate-key, which reads and patches one
// Node rather than listing.
func rotateAPIError(err error, what, server string) error {
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("%s on %s: forbidden (rotate-key needs get and patch on nodes): %w", what, server, err)
	}
	return apiError(err, what, server)
}
