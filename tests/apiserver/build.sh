#!/usr/bin/env bash
# Builds the kube-apiserver+etcd test harness into a cache directory keyed by
# the hash of its sources, and prints the binary's path on the last line of
# stdout. A second run with unchanged sources prints the path without building.
#
# Needs only Go and the Go module proxy. Uses the default GOCACHE/GOMODCACHE so
# Go's own caches are shared across clones.
#   NODEAGENT_HARNESS_CACHE  overrides the cache root
#                            (default ${XDG_CACHE_HOME:-$HOME/.cache}/nodeagent)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

GO="${GO:-}"
if [[ -z "$GO" ]]; then
  if command -v go >/dev/null 2>&1; then
    GO="$(command -v go)"
  elif [[ -x /usr/local/go/bin/go ]]; then
    GO=/usr/local/go/bin/go
  else
    echo "build.sh: no Go toolchain found (set GO=/path/to/go)" >&2
    exit 1
  fi
fi

# The Kubernetes version comes from go.mod; stamped into /version.
kube_version="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' go.mod)"
if [[ -z "$kube_version" ]]; then
  echo "build.sh: cannot find k8s.io/kubernetes version in go.mod" >&2
  exit 1
fi
major="${kube_version#v}"; major="${major%%.*}"
minor="${kube_version#v*.}"; minor="${minor%%.*}"

hash="$(cat go.mod go.sum build.sh $(ls *.go | LC_ALL=C sort) | sha256sum | cut -c1-16)"
root="${NODEAGENT_HARNESS_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/nodeagent}"
outdir="$root/apiserver-harness-$hash"
bin="$outdir/harness"

if [[ -x "$bin" ]]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$outdir"
tmp="$(mktemp "$outdir/harness.XXXXXX")"
trap 'rm -f "$tmp"' EXIT

pkg=k8s.io/component-base/version
ldflags="-s -w"
ldflags+=" -X $pkg.gitVersion=$kube_version"
ldflags+=" -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=nodeagent-harness"
ldflags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"

echo "build.sh: building harness ($kube_version) -> $bin" >&2
start=$(date +%s)
"$GO" build -trimpath -ldflags "$ldflags" -o "$tmp" . >&2
mv -f "$tmp" "$bin"
trap - EXIT
echo "build.sh: built in $(( $(date +%s) - start ))s" >&2
echo "$bin"
