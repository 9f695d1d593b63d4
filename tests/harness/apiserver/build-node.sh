#!/usr/bin/env bash
# Builds the node binary of one Kubernetes release (node/: an upstream kubelet and
# kube-scheduler, `node kubelet ...` / `node scheduler ...`, from the same k8s.io/kubernetes
# version as that release's apiserver harness) into a cache directory keyed by the release and
# the hash of its sources, and prints the binary's path on the last line of stdout. A second run
# with unchanged sources prints the path without building. Used by the real-node tests
# (tests/realnode, tests/support/realnode.py).
#
#   bash tests/harness/apiserver/build-node.sh [RELEASE]     # RELEASE: 1.37, 1.36, 1.35, ...
#
# RELEASE defaults to $NODEAGENT_KUBE_RELEASE, then to the newest release under releases/.
# The node program is its own module (node/go.mod only marks its root) built with
# `go build -modfile=releases/<release>/node.mod` (node.sum beside it; both written by
# releases/pin.sh), so the harness's go.mod, go.sum and cache key never carry the kubelet's
# dependencies. The version is stamped as build.sh stamps the harness's, so the kubelet
# reports the release's version (v1.37.2) to the apiserver.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
. ../../support/gobuild.sh

releases() { (cd releases && ls -d [0-9]*.*/ | tr -d / | sort -V -r); }

release="${1:-${NODEAGENT_KUBE_RELEASE:-}}"
release="${release#v}"
if [[ -z "$release" ]]; then
  release="$(releases | head -n 1)"
fi
want_patch=""
if [[ "$release" =~ ^([0-9]+\.[0-9]+)\.([0-9]+)$ ]]; then
  release="${BASH_REMATCH[1]}"
  want_patch="v${BASH_REMATCH[0]}"
fi
modfile="releases/$release/node.mod"
sumfile="releases/$release/node.sum"
if [[ ! -f "$modfile" ]]; then
  echo "build-node.sh: no node.mod for Kubernetes release '$release' (known: $(releases | tr '\n' ' '); releases/pin.sh writes it)" >&2
  exit 2
fi

kube_version="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$modfile")"
if [[ -z "$kube_version" ]]; then
  echo "build-node.sh: cannot find k8s.io/kubernetes version in $modfile" >&2
  exit 1
fi
if [[ -n "$want_patch" && "$want_patch" != "$kube_version" ]]; then
  echo "build-node.sh: release $release is pinned to $kube_version, not $want_patch (see releases/pin.sh)" >&2
  exit 2
fi
major="${kube_version#v}"; major="${major%%.*}"
minor="${kube_version#v*.}"; minor="${minor%%.*}"

pkg=k8s.io/component-base/version
ldflags="-s -w"
ldflags+=" -X $pkg.gitVersion=$kube_version"
ldflags+=" -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=nodeagent-harness"
ldflags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"

# `go build` runs in node/ (its module root); the cache key hashes the same files from here.
cd node
gobuild node "node-$release" "kubelet + kube-scheduler ($kube_version)" \
  "../$modfile ../$sumfile $(ls *.go | LC_ALL=C sort)" -- \
  -modfile="../$modfile" -trimpath -ldflags "$ldflags" .
