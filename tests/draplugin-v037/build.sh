#!/usr/bin/env bash
# Builds the modern, self-publishing DRA driver (upstream k8s.io/dynamic-resource-allocation v0.37
# helper, go 1.26) into a cache directory keyed by the hash of its sources, and prints the
# binary's path on the last line of stdout. A second run with unchanged sources prints the path
# without building.
#
# Needs only Go (1.26 or newer) and the Go module proxy. Uses the default GOCACHE/GOMODCACHE so
# Go's own caches are shared with the apiserver harness and the v0.30 plugin, and across clones.
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

hash="$(cat go.mod go.sum build.sh $(ls *.go | LC_ALL=C sort) | sha256sum | cut -c1-16)"
root="${NODEAGENT_HARNESS_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/nodeagent}"
outdir="$root/draplugin-v037-$hash"
bin="$outdir/draplugin-v037"

if [[ -x "$bin" ]]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$outdir"
tmp="$(mktemp "$outdir/draplugin-v037.XXXXXX")"
trap 'rm -f "$tmp"' EXIT

helper="$(awk '$1 == "k8s.io/dynamic-resource-allocation" {print $2; exit}' go.mod)"
echo "build.sh: building draplugin-v037 (k8s.io/dynamic-resource-allocation $helper) -> $bin" >&2
start=$(date +%s)
# -mod=readonly: go.mod/go.sum are the pins; a build never edits them or resolves new versions.
"$GO" build -mod=readonly -trimpath -ldflags "-s -w" -o "$tmp" . >&2
mv -f "$tmp" "$bin"
trap - EXIT
echo "build.sh: built in $(( $(date +%s) - start ))s" >&2
echo "$bin"
