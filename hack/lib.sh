# Functions the hack/ scripts share. Source it; it runs nothing by itself.

# go_install_once BIN NAME VERSION PACKAGE LDFLAGS builds the Go command
# NAME at VERSION (PACKAGE@VERSION, from the Go module proxy) into BIN/NAME
# unless it is there already. The stamp BIN/.NAME-VERSION says which version
# BIN/NAME is; the lock BIN/.NAME.lock (held until the caller exits) keeps
# concurrent runs from building it twice.
go_install_once() {
	local bin=$1 name=$2 version=$3 pkg=$4 ldflags=$5
	if [[ -x "$bin/$name" && -f "$bin/.$name-$version" ]]; then
		return
	fi
	mkdir -p "$bin"
	exec 9>"$bin/.$name.lock"
	flock 9
	if [[ -x "$bin/$name" && -f "$bin/.$name-$version" ]]; then
		return
	fi
	echo ">> building $name $version into $bin/$name (once)" >&2
	rm -f "$bin/.$name-v"*
	(cd "$bin" && GOWORK=off GOFLAGS= GOTOOLCHAIN=${GOTOOLCHAIN:-local} CGO_ENABLED=0 GOBIN="$bin" \
		go install -ldflags "$ldflags" "$pkg@$version")
	touch "$bin/.$name-$version"
}

# install_missing NEED installs, with apt-get and without recommends, the
# Debian packages of the commands missing here (neither on PATH nor in
# /usr/sbin or /sbin). NEED names an associative array: command -> package.
# Quick when nothing is missing; installing needs root.
install_missing() {
	local -n _need=$1
	local cmd missing=()
	for cmd in "${!_need[@]}"; do
		if ! command -v "$cmd" >/dev/null 2>&1 && [[ ! -x "/usr/sbin/$cmd" && ! -x "/sbin/$cmd" ]]; then
			missing+=("${_need[$cmd]}")
		fi
	done
	if [[ ${#missing[@]} -eq 0 ]]; then
		return 0
	fi
	mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
	echo ">> installing missing packages: ${missing[*]}" >&2
	if [[ $(id -u) -ne 0 ]]; then
		echo "need root to install packages (or install them yourself: ${missing[*]})" >&2
		return 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	# apt's own lock serialises concurrent installs; wait for it rather than fail.
	apt-get -o DPkg::Lock::Timeout=600 update -qq
	apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}"
}
