#!/bin/bash
# The "kube-apiserver" the e2e testbed starts inside the e2e-kernel guest
# (hack/e2e-kernel.sh puts it where the guest's kube-binaries.sh looks).
#
# Under emulation (TCG) a real kube-apiserver takes minutes to start, so the
# host runs it: this hands the host the files the testbed generated (admin
# token, service-account keys) and the flags, over the results share; waits
# for the host's API server to write its self-signed certificate (for
# --advertise-address 203.0.113.2, as in the guest) and copies it to
# --cert-dir; then forwards the control-plane namespace's port to the host
# (qemu's user network, 10.0.2.2) through the guest's root namespace.
set -eu
share=/mnt/out/apiserver
mkdir -p "$share/certs"
args=() certdir= port=6443
for a in "$@"; do
	case $a in
	--cert-dir=*)
		certdir=${a#*=}
		args+=("--cert-dir=@DIR@/certs")
		;;
	--token-auth-file=* | --service-account-key-file=* | --service-account-signing-key-file=*)
		f=${a#*=}
		cp "$f" "$share/$(basename "$f")"
		args+=("${a%%=*}=@DIR@/$(basename "$f")")
		;;
	--secure-port=*)
		port=${a#*=}
		args+=("$a")
		;;
	*) args+=("$a") ;;
	esac
done
printf '%s\n' "${args[@]}" >"$share/args.tmp"
mv "$share/args.tmp" "$share/args"
echo "e2e-kernel: kube-apiserver runs on the host; waiting for its certificate"
for _ in $(seq 1200); do
	[[ -s $share/certs/apiserver.crt && -s $share/certs/apiserver.key ]] && break
	sleep 0.5
done
sleep 1
mkdir -p "$certdir"
cp "$share/certs/apiserver.crt" "$share/certs/apiserver.key" "$certdir/"
exec /mnt/out/bin/e2e-kernel-proxy -listen "0.0.0.0:$port" -netns /proc/1/ns/net -to "10.0.2.2:$port"
