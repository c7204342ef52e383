package iptables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"time"
)

// Generationer is implemented by Runners that can tell cheaply whether the
// tables may have changed: when Generation returns the same value twice, no
// table changed in between. The Controller then skips reading the tables
// for an unchanged Config.
type Generationer interface {
	Generation() (uint64, error)
}

// errNoGeneration says a Runner cannot tell its generation.
var errNoGeneration = errors.New("no ruleset generation for this backend")

// Netlink constants of nf_tables (linux/netfilter/nfnetlink.h,
// linux/netfilter/nf_tables.h).
const (
	netlinkNetfilter = 12
	nfnlSubsysNFT    = 10
	nftMsgNewGen     = 15
	nftMsgGetGen     = 16
	nftaGenID        = 1
)

// nftGeneration asks nf_tables, in the calling thread's network namespace,
// for its ruleset generation: a counter that every committed nf_tables
// transaction (so every iptables-nft change, by anyone) increases. One
// netlink round trip, no process.
func nftGeneration() (uint64, error) {
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC, netlinkNetfilter)
	if err != nil {
		return 0, fmt.Errorf("opening a netfilter netlink socket: %w", err)
	}
	defer syscall.Close(fd)
	tv := syscall.NsecToTimeval(int64(time.Second))
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
		return 0, fmt.Errorf("setting a netlink timeout: %w", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("binding a netlink socket: %w", err)
	}
	// nlmsghdr (16 bytes) + nfgenmsg (family, version, res_id: 4 bytes).
	req := make([]byte, 20)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], nfnlSubsysNFT<<8|nftMsgGetGen)
	binary.NativeEndian.PutUint16(req[6:], syscall.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(req[8:], 1)
	if err := syscall.Sendto(fd, req, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("asking nf_tables for its generation: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := syscall.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, fmt.Errorf("reading the nf_tables generation: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return 0, fmt.Errorf("parsing the nf_tables generation: %w", err)
	}
	for _, m := range msgs {
		switch m.Header.Type {
		case syscall.NLMSG_ERROR:
			if len(m.Data) >= 4 {
				if errno := -int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
					return 0, fmt.Errorf("reading the nf_tables generation: %w", syscall.Errno(errno))
				}
			}
		case nfnlSubsysNFT<<8 | nftMsgNewGen:
			if len(m.Data) < 4 {
				continue
			}
			attrs := m.Data[4:]
			for len(attrs) >= 4 {
				l := int(binary.NativeEndian.Uint16(attrs))
				typ := binary.NativeEndian.Uint16(attrs[2:]) & 0x3fff
				if l < 4 || l > len(attrs) {
					break
				}
				if typ == nftaGenID && l >= 8 {
					return uint64(binary.BigEndian.Uint32(attrs[4:])), nil
				}
				attrs = attrs[min((l+3)&^3, len(attrs)):]
			}
		}
	}
	return 0, errors.New("reading the nf_tables generation: no generation in the answer")
}
