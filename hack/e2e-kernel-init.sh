#!/bin/busybox sh
# /init of the initramfs hack/e2e-kernel.sh boots (busybox-static only).
#
# It mounts the host's root filesystem (9p tag "hostroot", read-only) under
# an overlayfs whose upper layer is a tmpfs, so the guest runs the host's own
# binaries and the repository's test binaries while every write stays in
# guest memory. The second 9p share ("out", writable) is where the host's
# build outputs are and where results go. Then it chroots into the overlay
# and runs the guest script named on the kernel command line, and powers off.
#
# Kernel command line: meshd.kver=VERSION meshd.modules=HOST-PATH
# meshd.script=HOST-PATH [meshd.probe=1: print a marker and power off].
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev /tmp
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev

arg() { sed -n "s/.*\bmeshd\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
die() {
	echo "e2e-kernel init: $*"
	echo "MESHD-GUEST-EXIT 99"
	poweroff -f
}

if [ "$(arg probe)" = 1 ]; then
	echo "MESHD-PROBE-OK"
	poweroff -f
fi

# virtio_pci, 9pnet_virtio, 9p, overlay and their dependencies, in order
# (resolved on the host with modprobe --show-depends).
while read -r m; do
	insmod "/modules/$m" 2>/dev/null || true
done </modules/order

mkdir -p /host /rw /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=524288,cache=loose hostroot /host ||
	die "cannot mount the host root (9p tag hostroot)"
mount -t tmpfs -o size=75% tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work /newroot ||
	die "cannot mount the overlay"
mkdir -p /newroot/mnt/out
mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 out /newroot/mnt/out ||
	die "cannot mount the results share (9p tag out)"
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs tmpfs /newroot/dev/shm
mount -t tmpfs tmpfs /newroot/tmp
mount -t tmpfs tmpfs /newroot/run
mount -t tmpfs tmpfs /newroot/var/tmp
mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup 2>/dev/null

# The kernel's modules, from the cache directory on the host.
kver=$(arg kver)
mkdir -p "/newroot/lib/modules/$kver"
mount --bind "/newroot$(arg modules)" "/newroot/lib/modules/$kver" ||
	die "cannot bind the modules of $kver"

# Module autoloading (a bridge, an nft expression, ...): the kernel runs its
# modprobe helper in the initramfs' root, not in the chroot, so point it at
# a wrapper that runs the overlay's modprobe.
printf '#!/bin/sh\nexec chroot /newroot /sbin/modprobe "$@"\n' >/bin/modprobe-chroot
chmod 755 /bin/modprobe-chroot
echo /bin/modprobe-chroot >/proc/sys/kernel/modprobe

hostname meshd-e2e-kernel
chroot /newroot /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	HOME=/root TERM=dumb /bin/bash "$(arg script)"
rc=$?
sync
umount /newroot/mnt/out 2>/dev/null
echo "MESHD-GUEST-EXIT $rc"
poweroff -f
