package wg

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// watchLink calls changed when the interface name appears (a new link: a
// new index), disappears, or goes down, until ctx ends (Manager.Run's link
// watch; ns nil: the calling thread's namespace). Deleting a link
// takes its routes along, and the kernel does not report each route's
// removal (IPv4 flushes them silently), so this is how the daemon learns
// at once that its interface and routes need putting back (in the e2e:
// 8-48 ms instead of ~370 ms). After a subscription error it resubscribes
// (calling changed, since events may have been missed).
func watchLink(ctx context.Context, log *slog.Logger, ns *netns.NsHandle, name string, changed func()) error {
	const maxBackoff = 10 * time.Second
	backoff := 100 * time.Millisecond
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, maxBackoff)
		}
		updates := make(chan netlink.LinkUpdate, 64)
		done := make(chan struct{})
		errc := make(chan error, 1)
		err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{
			Namespace: nsOption(ns),
			ErrorCallback: func(err error) {
				select {
				case errc <- err:
				default:
				}
			},
		})
		if err != nil {
			close(done)
			log.Warn("subscribing to link notifications", "interface", name, "error", err, "retry_in", backoff)
			continue
		}
		if !first {
			changed()
		}
		err = followLink(ctx, updates, errc, name, changed)
		close(done)
		for range updates { // the subscription's goroutine closes it
		}
		if err == nil {
			return nil
		}
		log.Warn("link notifications lost; resubscribing", "interface", name, "error", err, "retry_in", backoff)
	}
}

// followLink consumes updates until ctx ends (nil) or the subscription
// fails (an error).
func followLink(ctx context.Context, updates <-chan netlink.LinkUpdate, errc <-chan error, name string, changed func()) error {
	lastIndex, lastUp := 0, false
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case u, ok := <-updates:
			if !ok {
				return fmt.Errorf("link subscription closed")
			}
			if u.Link == nil || u.Link.Attrs().Name != name {
				continue
			}
			a := u.Attrs()
			up := a.Flags&unix.IFF_UP != 0 // administratively up
			switch {
			case u.Header.Type == unix.RTM_DELLINK:
				lastIndex, lastUp = 0, false
				changed()
			case a.Index != lastIndex:
				lastIndex, lastUp = a.Index, up
				changed()
			case lastUp && !up:
				lastUp = false
				changed()
			default:
				lastUp = up
			}
		}
	}
}
