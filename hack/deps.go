//go:build deps

// Package hack pins the project's dependencies so every package can import
// them without editing go.mod concurrently.
package hack

import (
	_ "github.com/coreos/go-iptables/iptables"
	_ "github.com/oklog/run"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/spf13/pflag"
	_ "github.com/vishvananda/netlink"
	_ "github.com/vishvananda/netns"
	_ "golang.zx2c4.com/wireguard/conn"
	_ "golang.zx2c4.com/wireguard/device"
	_ "golang.zx2c4.com/wireguard/ipc"
	_ "golang.zx2c4.com/wireguard/tun"
	_ "golang.zx2c4.com/wireguard/wgctrl"
	_ "golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	_ "k8s.io/api/coordination/v1"
	_ "k8s.io/api/core/v1"
	_ "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	_ "k8s.io/apimachinery/pkg/apis/meta/v1"
	_ "k8s.io/client-go/dynamic"
	_ "k8s.io/client-go/informers"
	_ "k8s.io/client-go/kubernetes"
	_ "k8s.io/client-go/tools/cache"
	_ "k8s.io/client-go/tools/clientcmd"
	_ "k8s.io/client-go/tools/record"
	_ "k8s.io/client-go/util/workqueue"
	_ "sigs.k8s.io/yaml"
)
