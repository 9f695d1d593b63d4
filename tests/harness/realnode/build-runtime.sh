#!/usr/bin/env bash
# Builds the container runtime of the real-node tests (docs/testing/real-node.md) into cache
# directories keyed by what decides each binary, and prints, on the last line of stdout, a
# directory holding all of them:
#
#   containerd, containerd-shim-runc-v2, ctr   containerd v2.4.2 (Go modules, CGO off)
#   runc                                       runc v1.4.4 with seccomp (static, against the
#                                              libseccomp-dev .deb, extracted, not installed)
#   busybox                                    Debian's busybox-static (the images' only file)
#
# and installs Debian's containernetworking-plugins (/usr/lib/cni) if missing. A second run with
# nothing changed prints the directory without building (and without apt).
#
#   bash tests/harness/realnode/build-runtime.sh
#
# Needs Go, the Go module proxy, gcc with a static libc (libc6-dev) and apt (Debian). Cache root
# and Go as for tests/support/gobuild.sh (NODEAGENT_HARNESS_CACHE, GO).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
. "$repo/tests/support/gobuild.sh"
gobuild_find_go

CONTAINERD_VERSION=v2.4.2
RUNC_VERSION=v1.4.4
root="${NODEAGENT_HARNESS_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/nodeagent}"

# cached PREFIX CHECK-FILE BUILD-FUNCTION KEY-WORDS...: runs BUILD-FUNCTION OUTDIR unless
# $root/PREFIX-<key>/CHECK-FILE exists (key: the hash of KEY-WORDS); sets $dir to that directory.
cached() {
  local prefix=$1 check=$2 build=$3
  shift 3
  local key
  key="$(printf '%s\n' "$@" | sha256sum | cut -c1-16)"
  dir="$root/$prefix-$key"
  [[ -e "$dir/$check" ]] && return 0
  mkdir -p "$dir"
  exec 9>"$dir/.lock"
  flock 9
  if [[ ! -e "$dir/$check" ]]; then
    local tmp start=$SECONDS
    tmp="$(mktemp -d "$dir/build.XXXXXX")"
    echo "build-runtime.sh: building $prefix -> $dir" >&2
    "$build" "$tmp"
    mv -f "$tmp"/* "$dir"/
    rmdir "$tmp"
    echo "build-runtime.sh: $prefix built in $((SECONDS - start))s" >&2
  fi
  exec 9>&-
}

containerd_pkgs=(
  "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION"
  "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
  "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION"
)
# Stamped as containerd's Makefile does, so the CRI reports 2.4.2 (not 2.4.2+unknown).
containerd_args=(install -trimpath -tags "urfave_cli_no_docs no_btrfs"
  -ldflags "-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
  "${containerd_pkgs[@]}")
build_containerd() {
  # One at a time: `go install` of several module@version packages builds them in one command.
  GOBIN="$1" CGO_ENABLED=0 GOFLAGS= "$GO" "${containerd_args[@]}" >&2
}

runc_args=(install -trimpath -tags "seccomp osusergo netgo" -ldflags "-extldflags -static"
  "github.com/opencontainers/runc@$RUNC_VERSION")
build_runc() {
  local out=$1 deb
  deb="$(mktemp -d)"
  (cd "$deb" && apt_get_download libseccomp-dev)
  dpkg-deb -x "$deb"/libseccomp-dev_*.deb "$deb/x"
  local pc="$deb/x/usr/lib/x86_64-linux-gnu/pkgconfig"
  sed -i "s|^prefix=.*|prefix=$deb/x/usr|" "$pc/libseccomp.pc"
  GOBIN="$out" PKG_CONFIG_PATH="$pc" CGO_ENABLED=1 GOFLAGS= "$GO" "${runc_args[@]}" >&2
  "$out/runc" --version | grep -q 'seccomp' || {
    echo "build-runtime.sh: $out/runc has no seccomp support" >&2
    exit 1
  }
  rm -rf "$deb"
}

build_busybox() {
  local deb
  deb="$(mktemp -d)"
  (cd "$deb" && apt_get_download busybox-static)
  dpkg-deb -x "$deb"/busybox-static_*.deb "$deb/x"
  cp "$deb/x/bin/busybox" "$1/busybox"
  rm -rf "$deb"
}

# apt-get download, updating the package lists once when a new machine has none for it.
apt_get_download() {
  apt-get download -qq "$@" >/dev/null 2>&1 || {
    apt-get update -qq >/dev/null
    apt-get download -qq "$@" >/dev/null
  }
}

bash "$repo/scripts/apt-install" containernetworking-plugins
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] || {
  echo "build-runtime.sh: containernetworking-plugins installed no /usr/lib/cni/bridge" >&2
  exit 1
}

cached "containerd-$CONTAINERD_VERSION" containerd-shim-runc-v2 build_containerd \
  "$("$GO" env GOVERSION)" "${containerd_args[@]}"
containerd_dir=$dir
cached "runc-$RUNC_VERSION" runc build_runc "$("$GO" env GOVERSION)" "${runc_args[@]}" libseccomp-dev
runc_dir=$dir
cached busybox-static busybox build_busybox "$(apt-cache policy busybox-static 2>/dev/null |
  awk '/Candidate:/ {print $2}')"
busybox_dir=$dir

link_all() {
  local name
  for name in containerd containerd-shim-runc-v2 ctr; do ln -s "$containerd_dir/$name" "$1/$name"; done
  ln -s "$runc_dir/runc" "$1/runc"
  ln -s "$busybox_dir/busybox" "$1/busybox"
}

# The directory the tests use: links to the three builds (keyed by them).
cached realnode-runtime containerd link_all "$containerd_dir" "$runc_dir" "$busybox_dir"
echo "$dir"
