#!/bin/sh
# mmdebstrap --customize-hook for meshd's runtime base (hack/image.sh): the
# packages were only extracted (--variant=extract: no maintainer scripts, so
# it works for any architecture), so do here what their scripts would do,
# then trim what a node agent never needs. $1 is the root directory.
set -eu
root=$1
cd "$root"

# Users and groups (base-passwd's postinst).
cp usr/share/base-passwd/passwd.master etc/passwd
cp usr/share/base-passwd/group.master etc/group

# /var/run and /var/lock point into /run (base-files' postinst).
rm -rf var/run var/lock
ln -s /run var/run
ln -s /run/lock var/lock

# The iptables alternatives (iptables' postinst): nft is Debian's default;
# meshd --iptables-backend=legacy calls iptables-legacy* directly.
for fam in iptables ip6tables; do
	for suffix in "" -save -restore; do
		ln -sf "$fam-nft$suffix" "usr/sbin/$fam$suffix"
	done
done

# The CA bundle (ca-certificates' postinst, without openssl's rehash).
mkdir -p etc/ssl/certs
cat usr/share/ca-certificates/mozilla/*.crt > etc/ssl/certs/ca-certificates.crt

# A few busybox applets for the init container and for debugging inside the
# pod (kubectl exec). iproute2's ip/ss/bridge stay the real ones.
for a in cat ls ps grep sed head tail mkdir rm cp mv ln chmod sleep env uname mount umount touch wc find less vi; do
	[ -e "bin/$a" ] || [ -e "usr/bin/$a" ] || ln -s busybox "bin/$a"
done

# The package list, for image scanners: dpkg's status file was never written
# (nothing was configured), so record what was extracted.
mkdir -p var/lib/dpkg
: > var/lib/dpkg/status
for deb in var/cache/apt/archives/*.deb; do
	dpkg-deb -f "$deb" Package Version Architecture Source Maintainer Description | sed '1a Status: install ok installed' >> var/lib/dpkg/status
	echo >> var/lib/dpkg/status
done

# Trim: documentation (copyright files stay), locales, charset converters,
# dpkg and debconf tooling (nothing is installed into the image later).
find usr/share/doc -mindepth 2 ! -name copyright -delete 2>/dev/null || true
rm -rf usr/share/man usr/share/info usr/share/locale usr/share/lintian usr/share/bash-completion \
	usr/share/bug usr/share/doc-base usr/share/dict usr/share/menu usr/share/pixmaps usr/share/polkit-1 \
	usr/share/perl5 usr/share/debconf usr/share/initramfs-tools usr/share/base-passwd usr/share/dpkg \
	usr/lib/*/gconv usr/lib/locale usr/include \
	usr/bin/localedef usr/bin/iconv usr/sbin/iconvconfig usr/bin/openssl usr/lib/ssl/misc \
	usr/bin/dpkg usr/bin/dpkg-* usr/sbin/dpkg-* usr/bin/debconf* usr/sbin/installkernel sbin/installkernel \
	var/lib/dpkg/info var/cache/debconf
# The loader cache; for a foreign architecture (no emulation) there is none
# and the loader searches its default multiarch directories.
chroot "$root" /sbin/ldconfig 2>/dev/null || rm -f etc/ld.so.cache
