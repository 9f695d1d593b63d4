#!/usr/bin/env bash
# Writes releases/<minor>/go.mod and go.sum for one Kubernetes release, from the
# release's own go.mod on the Go module proxy: k8s.io/kubernetes at the patch
# version, every staging module it replaces with ./staging/... pinned to the
# matching v0.<minor>.<patch>, and the embedded etcd server at the version the
# release itself requires. Then `go mod tidy` against the shared *.go sources.
#
#   bash tests/harness/apiserver/releases/pin.sh v1.37.2
#
# It also writes releases/<minor>/node.mod and node.sum, the same pins without etcd
# for the node binary (node/: kubelet + kube-scheduler, its own module, tidied
# against node/*.go; build-node.sh).
#
# Run it to add a release or move one to a new patch version; build.sh and
# build-node.sh read only the files this writes.
set -euo pipefail

version="${1:?usage: pin.sh vMAJOR.MINOR.PATCH}"
[[ "$version" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || { echo "pin.sh: bad version $version" >&2; exit 2; }
minor="${BASH_REMATCH[1]}"
staging="v0.${minor}.${BASH_REMATCH[2]}"
release="1.${minor}"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"

kmod="$("$GO" mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')"
[[ -f "$kmod" ]] || { echo "pin.sh: cannot download k8s.io/kubernetes@$version" >&2; exit 1; }
godir="$(awk '$1 == "go" {print $2; exit}' "$kmod")"
etcd="$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2; exit}' "$kmod")"
# The release's binaries are built with its own GODEBUG defaults.
godebug="$(awk '$1 == "godebug" {print; exit}' "$kmod")"

out="releases/$release"
mkdir -p "$out"
{
  echo "module nodeagent/tests/harness/apiserver"
  echo
  echo "go $godir"
  echo
  if [[ -n "$godebug" ]]; then echo "$godebug"; echo; fi
  echo "require ("
  echo "	go.etcd.io/etcd/server/v3 $etcd"
  echo "	k8s.io/kubernetes $version"
  echo ")"
  echo
  echo "// k8s.io/kubernetes requires its staging repositories at v0.0.0 and replaces"
  echo "// them with ./staging/... paths that do not exist outside its own tree; pin"
  echo "// each one to the matching published release."
  echo "replace ("
  awk -v v="$staging" '$2 == "=>" && $3 ~ /^\.\/staging\// {print "\t" $1 " => " $1 " " v}' "$kmod" | LC_ALL=C sort
  echo ")"
} > "$out/go.mod"
rm -f "$out/go.sum"
"$GO" mod tidy -modfile="$out/go.mod"
sed -e 's#^module \(nodeagent/tests/harness/apiserver\)$#module \1/node#' \
  -e '/^	go\.etcd\.io\/etcd\/server\/v3 /d' "$out/go.mod" > "$out/node.mod"
cp "$out/go.sum" "$out/node.sum"
(cd node && "$GO" mod tidy -modfile="../$out/node.mod")
echo "pin.sh: $out/go.mod: k8s.io/kubernetes $version, etcd $etcd, go $godir" >&2
