#!/usr/bin/env bash
# Runs meshd's kernel-WireGuard tests on a real Linux kernel, in qemu.
#
# The host has no WireGuard module, so this boots Debian's linux-image-amd64
# kernel (the .deb is fetched with `apt-get download` and unpacked into
# ${MESHD_CACHE:-$HOME/.cache/meshd}/kernel-<package>_<version>/, never
# installed on the host) with a busybox initramfs (hack/e2e-kernel-init.sh).
# The guest sees the host's root filesystem read-only over 9p with a tmpfs
# overlay on top (the virtme technique), so it runs the host's tools and the
# test binaries built here; a second, writable 9p share carries the binaries
# in and the results out. Inside, hack/e2e-kernel-guest.sh loads wireguard
# and friends and runs the pkg/wg kernel tests, the throughput comparison and
# the e2e scenarios with --wireguard kernel, printing their `go test -v`
# output to the console. The guest's e2e testbed is the usual one, except
# that its kube-apiserver (minutes to start under emulation) runs here, on
# the host, in a network namespace of its own where qemu runs too; the guest
# reaches it over qemu's user network (hack/e2e-kernel-apiserver.sh,
# hack/e2e-kernel-proxy). make e2e-kernel runs this through
# e2e/kernelvm (go test), which turns each guest test into a subtest.
#
# KVM is used when a short probe boot shows that it works, else TCG.
# Exit status: 0 when every guest test passed.
#
# Environment:
#   E2E_KERNEL_ACCEL=kvm|tcg   skip the probe
#   E2E_KERNEL_PKG=linux-image-6.1.0-NN-amd64   another kernel package
#   E2E_KERNEL_MEM=3072        guest memory in MiB
#   E2E_KERNEL_TIMEOUT=1800    seconds before the guest is killed
#   E2E_KERNEL_RUN='wg throughput e2e'   which guest steps to run
#   E2E_KERNEL_E2E_RUN=REGEX   which e2e scenarios to run (go test -run)
#   E2E_KERNEL_KEEP=1          keep the work directory (logs, binaries)
#   E2E_KERNEL_SUMMARY=FILE    copy the guest's one-line-per-test summary there
#   E2E_PREFIX=xy-             the host network namespace qemu runs in is xy-vm (default mek-vm)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
CACHE=${MESHD_CACHE:-$HOME/.cache/meshd}
t0=$(date +%s)
say() { echo ">> e2e-kernel: $*" >&2; }

# --- Debian packages, only if missing.
declare -A need=([qemu-system-x86_64]=qemu-system-x86 [cpio]=cpio [depmod]=kmod [modprobe]=kmod)
missing=()
for c in "${!need[@]}"; do
	command -v "$c" >/dev/null 2>&1 || [[ -x /sbin/$c || -x /usr/sbin/$c ]] || missing+=("${need[$c]}")
done
dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
if [[ ${#missing[@]} -gt 0 ]]; then
	mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
	say "installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
export PATH=$PATH:/usr/sbin:/sbin

# --- The kernel: Debian's linux-image-amd64 dependency, cached.
pkg=${E2E_KERNEL_PKG:-}
if [[ -z $pkg ]]; then
	pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -1)
	if [[ -z $pkg ]]; then
		apt-get update -qq
		pkg=$(apt-cache depends linux-image-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -1)
	fi
fi
[[ -n $pkg ]] || { say "cannot find the kernel package behind linux-image-amd64"; exit 1; }
kver=${pkg#linux-image-}
pkgver=$(apt-cache policy "$pkg" | sed -n 's/^ *Candidate: //p')
kdir="$CACHE/kernel-${pkg}_${pkgver}"
if [[ ! -f $kdir/lib/modules/$kver/modules.dep ]]; then
	say "fetching $pkg $pkgver into $kdir"
	tmp=$(mktemp -d)
	(cd "$tmp" && chmod 755 . && apt-get download "$pkg=$pkgver" >/dev/null 2>&1 || apt-get download "$pkg=$pkgver")
	rm -rf "$kdir.part"
	mkdir -p "$kdir.part"
	dpkg-deb -x "$tmp"/*.deb "$kdir.part"
	rm -rf "$tmp"
	depmod -b "$kdir.part" "$kver"
	rm -rf "$kdir"
	mv "$kdir.part" "$kdir"
fi
vmlinuz="$kdir/boot/vmlinuz-$kver"

# --- Work directory: the guest's writable share (binaries in, results out).
work=$(mktemp -d /var/tmp/meshd-e2e-kernel.XXXXXX)
cleanup() {
	local rc=$?
	set +e
	for p in kube-apiserver etcd; do
		[[ -f $work/$p.pid ]] && kill "$(cat "$work/$p.pid")" 2>/dev/null
	done
	[[ -n ${vmns:-} ]] && ip netns del "$vmns" 2>/dev/null
	if [[ -z ${E2E_KERNEL_KEEP:-} ]]; then rm -rf "$work"; else say "work directory kept: $work"; fi
	exit "$rc"
}
trap cleanup EXIT
mkdir -p "$work/bin" "$work/initrd/bin" "$work/initrd/modules"

# --- initramfs: busybox, /init and the modules for 9p and overlayfs.
cp /bin/busybox "$work/initrd/bin/busybox"
cp hack/e2e-kernel-init.sh "$work/initrd/init"
chmod 755 "$work/initrd/init"
: >"$work/initrd/modules/order"
for m in virtio_pci 9pnet_virtio 9p overlay; do
	modprobe -d "$kdir" -S "$kver" --show-depends "$m" | while read -r kind path _; do
		[[ $kind == insmod ]] || continue
		b=$(basename "$path")
		grep -qx "$b" "$work/initrd/modules/order" && continue
		cp "$path" "$work/initrd/modules/$b"
		echo "$b" >>"$work/initrd/modules/order"
	done
done
(cd "$work/initrd" && find . | cpio -o -H newc --quiet | gzip -1) >"$work/initrd.gz"

# --- Test binaries, built here (building inside an emulated guest is slow).
say "building test binaries"
export GOFLAGS=${GOFLAGS:-}
go test -c -o "$work/bin/wg.test" ./pkg/wg
go test -c -tags e2e -o "$work/bin/e2e.test" ./e2e
go build -o "$work/bin/meshd" ./cmd/meshd
go build -tags e2e -o "$work/bin/e2etool" ./e2e/cmd/e2etool
go build -o "$work/bin/e2e-kernel-proxy" ./hack/e2e-kernel-proxy
kubedir=$(bash hack/kube-binaries.sh kube-apiserver kubectl)
# The guest's kube binaries: the real kubectl, and in place of kube-apiserver
# hack/e2e-kernel-apiserver.sh, which has the host run the real one (under
# TCG it would take minutes to start) and forwards to it.
gkube="$work/cache/$(basename "$kubedir")"
mkdir -p "$gkube"
ln -s "$kubedir/kubectl" "$gkube/kubectl"
cp hack/e2e-kernel-apiserver.sh "$gkube/kube-apiserver"
tbuild=$(date +%s)

# --- qemu: KVM if a short probe boots, else TCG.
qemu_base=(qemu-system-x86_64 -nographic -no-reboot -net none -kernel "$vmlinuz" -initrd "$work/initrd.gz"
	-virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap")
accel=${E2E_KERNEL_ACCEL:-} cpu=max
if [[ -z $accel ]]; then
	accel=tcg
	if [[ -w /dev/kvm ]]; then
		for c in host max; do
			if timeout 15 "${qemu_base[@]}" -accel kvm -cpu "$c" -m 256 \
				-append "console=ttyS0 quiet panic=-1 meshd.probe=1" </dev/null 2>&1 | grep -q MESHD-PROBE-OK; then
				accel=kvm cpu=$c
				break
			fi
		done
		[[ $accel == kvm ]] || say "KVM probe did not boot within 15 s: using TCG (software emulation)"
	fi
fi
[[ $accel == kvm && -n ${E2E_KERNEL_ACCEL:-} ]] && cpu=host
say "booting $pkg ($pkgver) with $accel"
cat >"$work/env" <<EOF
E2E_KERNEL_RUN='${E2E_KERNEL_RUN:-wg throughput e2e}'
E2E_KERNEL_E2E_RUN='${E2E_KERNEL_E2E_RUN:-}'
E2E_KERNEL_ACCEL='$accel'
REPO='$repo'
KUBE_VERSION='${kubedir##*/kube-}'
EOF
# qemu runs in a network namespace of its own: the guest's user-mode network
# (10.0.2.2) reaches only that namespace's loopback, where the host-side
# etcd and kube-apiserver of the guest's testbed listen.
vmns=${E2E_PREFIX:-mek-}vm
remove_vmns() {
	if ip netns list | grep -qw "^$vmns"; then
		for p in $(ip netns pids "$vmns"); do kill -9 "$p" 2>/dev/null || true; done
		sleep 0.2
		ip netns del "$vmns" || true
	fi
}
remove_vmns
ip netns add "$vmns"
ip -n "$vmns" link set lo up
# The guest's testbed asks for its API server by writing the flags into
# $work/apiserver/args (hack/e2e-kernel-apiserver.sh); run it here.
host_apiserver() {
	local share=$work/apiserver
	while [[ ! -f $share/args ]]; do
		[[ -e $work/qemu.done ]] && return
		sleep 0.5
	done
	mapfile -t args < <(sed "s#@DIR@#$share#g" "$share/args")
	say "guest asked for kube-apiserver: starting etcd and kube-apiserver on the host (netns $vmns)"
	ip netns exec "$vmns" etcd --name e2e-kernel --data-dir "$share/etcd" \
		--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
		--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
		--initial-cluster e2e-kernel=http://127.0.0.1:2380 --log-level warn >"$work/etcd.log" 2>&1 &
	echo $! >"$work/etcd.pid"
	ip netns exec "$vmns" "$kubedir/kube-apiserver" "${args[@]}" >"$work/kube-apiserver.log" 2>&1 &
	echo $! >"$work/kube-apiserver.pid"
}
host_apiserver &
hpid=$!
tboot=$(date +%s)
set +e
ip netns exec "$vmns" timeout "${E2E_KERNEL_TIMEOUT:-1800}" "${qemu_base[@]}" -accel "$accel" -cpu "$cpu" -smp 2 -m "${E2E_KERNEL_MEM:-3072}" \
	-virtfs "local,path=$work,mount_tag=out,security_model=none,multidevs=remap" \
	-netdev user,id=n0 -device virtio-net-pci,netdev=n0,romfile= \
	-append "console=ttyS0 quiet loglevel=3 panic=-1 meshd.kver=$kver meshd.modules=$kdir/lib/modules/$kver meshd.script=$repo/hack/e2e-kernel-guest.sh" \
	</dev/null 2>&1 | tee "$work/console.log"
qrc=${PIPESTATUS[0]}
set -e
touch "$work/qemu.done"
wait "$hpid" 2>/dev/null || true
for p in kube-apiserver etcd; do
	[[ -f $work/$p.pid ]] && kill "$(cat "$work/$p.pid")" 2>/dev/null || true
done
sleep 1
remove_vmns
tend=$(date +%s)
if [[ $qrc -ne 0 ]]; then
	say "qemu exited with status $qrc (124: killed after ${E2E_KERNEL_TIMEOUT:-1800} s)"
fi
rc=$(sed -n 's/^MESHD-GUEST-EXIT \([0-9]*\).*/\1/p' "$work/console.log" | tail -1)
say "kernel $pkg $pkgver ($accel); build $((tbuild - t0)) s, guest $((tend - tboot)) s, total $((tend - t0)) s"
if [[ -f $work/summary ]]; then
	say "guest results:"
	sed 's/^/   /' "$work/summary" >&2
	if [[ -n ${E2E_KERNEL_SUMMARY:-} ]]; then
		cp "$work/summary" "$E2E_KERNEL_SUMMARY"
		echo "timing: build $((tbuild - t0)) s, guest $((tend - tboot)) s, accel $accel" >>"$E2E_KERNEL_SUMMARY"
	fi
fi
if [[ -z $rc ]]; then
	say "FAIL: the guest did not report an exit status"
	exit 1
fi
if [[ $rc -ne 0 ]]; then
	say "FAIL: guest tests failed (status $rc)"
	exit 1
fi
say "PASS"
