#!/usr/bin/env bash
# Builds the Katalyst reporter plugin (github.com/kubewharf/katalyst-api's skeleton and generated
# reporterplugin/v1alpha1 service, used unchanged) into a cache directory keyed by the hash of its
# sources, and prints the binary's path on the last line of stdout. A second run with unchanged
# sources prints the path without building.
#
# Needs only Go and the Go module proxy. Uses the default GOCACHE/GOMODCACHE so Go's own caches
# are shared with the apiserver harness and across clones.
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
outdir="$root/katalystplugin-$hash"
bin="$outdir/katalystplugin"

if [[ -x "$bin" ]]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$outdir"
tmp="$(mktemp "$outdir/katalystplugin.XXXXXX")"
trap 'rm -f "$tmp"' EXIT

api="$(awk '$1 == "github.com/kubewharf/katalyst-api" {print $2; exit}' go.mod)"
echo "build.sh: building katalystplugin (github.com/kubewharf/katalyst-api $api) -> $bin" >&2
start=$(date +%s)
# -mod=readonly: go.mod/go.sum are the pins; a build never edits them or resolves new versions.
"$GO" build -mod=readonly -trimpath -ldflags "-s -w" -o "$tmp" . >&2
mv -f "$tmp" "$bin"
trap - EXIT
echo "build.sh: built in $(( $(date +%s) - start ))s" >&2
echo "$bin"
