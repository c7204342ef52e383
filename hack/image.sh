#!/usr/bin/env bash
# Build the meshd image from ./Dockerfile (`make image IMAGE=REF`).
#
#   IMAGE=REF            the image reference to tag (required)
#   PLATFORMS=LIST       comma-separated, e.g. linux/amd64,linux/arm64
#                        (default: the host's platform)
#   PUSH=1               push REF (a manifest list when PLATFORMS has several)
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

if [[ $IMAGE_BASE == registry ]]; then
	plat=${PLATFORMS:-linux/$($GO env GOARCH)}
	if command -v docker >/dev/null && docker buildx version >/dev/null 2>&1; then
		out=(--load)
		[[ -n $PUSH ]] && out=(--push)
		[[ $plat == *,* && -z $PUSH ]] && out=() # a multi-arch result can only be pushed (or kept in the build cache)
		exec docker buildx build --platform "$plat" "${buildargs[@]}" -t "$IMAGE" "${out[@]}" .
	fi
	./hack/image-deps.sh
	podman build --platform "$plat" "${buildargs[@]}" --manifest "$IMAGE" .
	if [[ -n $PUSH ]]; then podman manifest push --all "$IMAGE" "docker://$IMAGE"; fi
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

if [[ ${#refs[@]} -gt 1 ]]; then
	podman manifest rm "$IMAGE" >/dev/null 2>&1 || podman rmi "$IMAGE" >/dev/null 2>&1 || true
	podman manifest create "$IMAGE" >/dev/null
	for r in "${refs[@]}"; do podman manifest add "$IMAGE" "containers-storage:$r" >/dev/null; done
fi
for r in "${refs[@]}"; do
	size=$(podman image inspect --format '{{.Size}}' "$r")
	log "$r: $((size / 1000000)) MB ($size bytes), version $VERSION"
done
if [[ -n $PUSH ]]; then
	if [[ ${#refs[@]} -gt 1 ]]; then
		podman manifest push --all "$IMAGE" "docker://$IMAGE"
	else
		podman push "$IMAGE"
	fi
fi
