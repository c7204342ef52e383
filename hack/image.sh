#!/usr/bin/env bash
# Build the meshd image from ./Dockerfile (`make image IMAGE=REF`).
#
#   IMAGE=REF            the image reference to tag (required)
#   PLATFORMS=LIST       comma-separated, e.g. linux/amd64,linux/arm64
#                        (default: the host's platform)
#   PUSH=1               push REF (a manifest list when PLATFORMS has several:
#                        per-platform images REF-ARCH are built locally, the
#                        list exists only while it is pushed)
#   IMAGE_BASE=local     (default) no registry needed: the runtime base is
#                        built from Debian packages with mmdebstrap and the
#                        binaries with the host's Go, then podman builds the
#                        Dockerfile's "runtime-local"/"prebuilt" stages
#   IMAGE_BASE=registry  the Dockerfile's defaults (golang and debian images
#                        pulled from a registry), with `docker buildx` if it
#                        exists, else `podman build --platform`
#   VERSION=V            default: git describe --tags --always --dirty
#
# The local base is cached in $MESHD_CACHE/image (default ~/.cache/meshd),
# keyed by its package list, suite, mirrors, architecture and hook; delete
# that directory (or set IMAGE_BASE_REFRESH=1) to pick up Debian updates.
# podman runs with --runtime runc and its own containers.conf (empty
# default_ulimits) passed in CONTAINERS_CONF; /etc is left alone.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:?set IMAGE=REF, e.g. make image IMAGE=localhost/meshd:dev}
PLATFORMS=${PLATFORMS:-}
PUSH=${PUSH:-}
IMAGE_BASE=${IMAGE_BASE:-local}
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
REVISION=${REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
if [[ -n ${SOURCE_DATE_EPOCH:-} ]]; then
	CREATED=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
else
	CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)
fi
SOURCE=${SOURCE:-https://github.com/meshd/meshd}
CACHE=${MESHD_CACHE:-$HOME/.cache/meshd}
GO=${GO:-go}

buildargs=(--build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION"
	--build-arg "CREATED=$CREATED" --build-arg "SOURCE=$SOURCE")

log() { echo ">> $*" >&2; }

# The host keeps net.ipv4.ip_forward as it was: podman's bridge networking
# (netavark) turns it on for a build's RUN steps, and the testbed (and many
# hosts) rely on it staying 0. Builds here run with --network none (local
# base) or --network host (registry base: RUN steps download, no bridge);
# this restores it anyway if anything else changed it.
fwd_file=/proc/sys/net/ipv4/ip_forward
fwd0=$(cat "$fwd_file" 2>/dev/null || echo "")
restore_ip_forward() {
	local now
	now=$(cat "$fwd_file" 2>/dev/null || echo "")
	if [[ -n $fwd0 && $now != "$fwd0" ]]; then
		if echo "$fwd0" >"$fwd_file" 2>/dev/null; then
			log "restored net.ipv4.ip_forward=$fwd0 (the build had set it to $now)"
		else
			log "WARNING: the build set net.ipv4.ip_forward=$now (was $fwd0) and it cannot be restored: run sysctl -w net.ipv4.ip_forward=$fwd0"
		fi
	fi
}
trap restore_ip_forward EXIT

# push_list IMAGE REF... pushes a manifest list IMAGE of the per-platform
# images REF... and removes the local list again: podman 4.3 (Debian 12)
# cannot list or build images while a local manifest list exists
# ("fetching target platform image selected from image index",
# containers/podman#19757), so none is kept in the store.
push_list() {
	local list=$1 r
	shift
	podman manifest rm "$list" >/dev/null 2>&1 || true
	podman manifest create "$list" >/dev/null
	for r in "$@"; do podman manifest add "$list" "containers-storage:$r" >/dev/null; done
	local rc=0
	podman manifest push --all "$list" "docker://$list" || rc=$?
	podman manifest rm "$list" >/dev/null 2>&1 || true
	return "$rc"
}

if [[ $IMAGE_BASE == registry ]]; then
	plat=${PLATFORMS:-linux/$($GO env GOARCH)}
	if command -v docker >/dev/null && docker buildx version >/dev/null 2>&1; then
		out=(--load)
		[[ -n $PUSH ]] && out=(--push)
		[[ $plat == *,* && -z $PUSH ]] && out=() # a multi-arch result can only be pushed (or kept in the build cache)
		exec docker buildx build --platform "$plat" "${buildargs[@]}" -t "$IMAGE" "${out[@]}" .
	fi
	./hack/image-deps.sh
	# One image per platform (IMAGE, or IMAGE-ARCH for several); host
	# networking for the RUN steps' downloads: no bridge, so podman leaves
	# the host's ip_forward alone.
	IFS=, read -r -a rplats <<<"$plat"
	rrefs=()
	for p in "${rplats[@]}"; do
		ref=$IMAGE
		[[ ${#rplats[@]} -gt 1 ]] && ref=$IMAGE-${p#*/}
		podman build --network host --platform "$p" "${buildargs[@]}" -t "$ref" .
		rrefs+=("$ref")
	done
	if [[ -n $PUSH ]]; then
		if [[ ${#rrefs[@]} -gt 1 ]]; then push_list "$IMAGE" "${rrefs[@]}"; else podman push "$IMAGE"; fi
	fi
	exit 0
fi
if [[ $IMAGE_BASE != local ]]; then
	echo "IMAGE_BASE=$IMAGE_BASE: want local or registry" >&2
	exit 2
fi

./hack/image-deps.sh
mkdir -p "$CACHE/image"
# podman: runc (crun fails on hybrid cgroups) and no default ulimits
# (setting them fails in this kind of sandbox).
conf=$CACHE/image/containers.conf
cat > "$conf.tmp" <<'CONF'
[containers]
default_ulimits = []

[engine]
runtime = "runc"
CONF
mv "$conf.tmp" "$conf"
export CONTAINERS_CONF=$conf

# The runtime base: these packages (and their dependencies) from Debian.
suite=bookworm
packages=base-files,base-passwd,libc-bin,dash,busybox,iptables,iproute2,wireguard-tools,ca-certificates
mirrors=(
	"deb http://deb.debian.org/debian $suite main"
	"deb http://deb.debian.org/debian $suite-updates main"
	"deb http://deb.debian.org/debian-security $suite-security main"
)
hook=hack/image-base-hook.sh

base_image() { # arch -> prints the local base image reference, building it if needed
	local arch=$1 key tar ref
	key=$( { echo "$suite $arch $packages"; printf '%s\n' "${mirrors[@]}"; cat "$hook"; } | sha256sum | cut -c1-16)
	tar=$CACHE/image/base-$arch-$key.tar
	ref=localhost/meshd-base:$key-$arch
	(
		flock 9
		if [[ -n ${IMAGE_BASE_REFRESH:-} || ! -s $tar ]]; then
			log "building the runtime base for $arch from Debian packages ($packages)"
			rm -f "$tar.tmp"
			mmdebstrap --quiet --format=tar --variant=extract --architectures="$arch" --include="$packages" \
				--extract-hook="$PWD/$hook \"\$1\"" "$suite" "$tar.tmp" "${mirrors[@]}" >&2
			mv "$tar.tmp" "$tar"
			# Bases of an older package list or hook are never used again.
			find "$CACHE/image" -maxdepth 1 -name "base-$arch-*.tar" ! -name "${tar##*/}" -delete
			podman images --format '{{.Repository}}:{{.Tag}}' --filter "reference=localhost/meshd-base:*-$arch" |
				xargs -r podman rmi >/dev/null 2>&1 || true
		fi
		if ! podman image exists "$ref"; then
			podman import --quiet --arch "$arch" --os linux \
				--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
				--message "meshd runtime base: Debian $suite, $packages" "$tar" "$ref" >/dev/null
		fi
	) 9>"$CACHE/image/base-$arch.lock"
	echo "$ref"
}

plats=${PLATFORMS:-linux/$($GO env GOARCH)}
IFS=, read -r -a plats <<<"$plats"
refs=()
for p in "${plats[@]}"; do
	os=${p%%/*} arch=${p#*/}
	if [[ $os != linux || -z $arch || $arch == */* ]]; then
		echo "platform $p: want linux/ARCH (e.g. linux/arm64)" >&2
		exit 2
	fi
	base=$(base_image "$arch")
	# The Dockerfile's build command, run on the host.
	out=_output/image/$os-$arch
	log "building meshd and meshctl $VERSION for $p"
	rm -rf "$out"
	mkdir -p "$out"
	CGO_ENABLED=0 GOFLAGS="-trimpath -tags=grpcnotrace" GOTOOLCHAIN=local GOOS=$os GOARCH=$arch \
		$GO build -ldflags "-s -w -X main.version=$VERSION" -o "$out/" ./cmd/meshd ./cmd/meshctl
	ref=$IMAGE
	[[ ${#plats[@]} -gt 1 ]] && ref=$IMAGE-$arch
	log "podman build $ref ($p)"
	podman build --quiet --pull=never --platform "$p" --network none "${buildargs[@]}" \
		--build-arg "BASE_IMAGE=$base" --build-arg RUNTIME=runtime-local --build-arg BINARIES=prebuilt \
		-t "$ref" . >/dev/null
	# The intermediate image of the prebuilt stage (the binaries alone).
	podman image prune -f --filter label=io.meshd.image.stage=prebuilt >/dev/null
	refs+=("$ref")
done

for r in "${refs[@]}"; do
	size=$(podman image inspect --format '{{.Size}}' "$r")
	log "$r: $((size / 1000000)) MB ($size bytes), version $VERSION"
done
if [[ -n $PUSH ]]; then
	if [[ ${#refs[@]} -gt 1 ]]; then
		push_list "$IMAGE" "${refs[@]}"
	else
		podman push "$IMAGE"
	fi
elif [[ ${#refs[@]} -gt 1 ]]; then
	log "per-platform images ${refs[*]}; PUSH=1 pushes them as the manifest list $IMAGE (no local list is kept)"
fi
