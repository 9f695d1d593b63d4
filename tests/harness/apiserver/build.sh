#!/usr/bin/env bash
# Builds the kube-apiserver+etcd test harness of one Kubernetes release into a
# cache directory keyed by the release and the hash of its sources, and prints
# the binary's path on the last line of stdout. A second run with unchanged
# sources prints the path without building.
#
#   bash tests/harness/apiserver/build.sh [RELEASE]     # RELEASE: 1.37, 1.36, 1.35, ...
#   bash tests/harness/apiserver/build.sh --list        # the releases, newest first
#
# RELEASE defaults to $NODEAGENT_KUBE_RELEASE, then to the newest release under
# releases/. Every release shares the Go sources (*.go) and has its own
# releases/<release>/go.mod and go.sum (written by releases/pin.sh), used with
# `go build -modfile`, so all releases share one GOCACHE and GOMODCACHE.
#
# Needs only Go and the Go module proxy. Uses the default GOCACHE/GOMODCACHE so
# Go's own caches are shared across clones and releases. The build itself (Go,
# the cache directory keyed by the sources and the command line, the lock) is
# tests/support/gobuild.sh's.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
. ../../support/gobuild.sh

releases() { (cd releases && ls -d [0-9]*.*/ | tr -d / | sort -V -r); }

if [[ "${1:-}" == "--list" ]]; then
  releases
  exit 0
fi

release="${1:-${NODEAGENT_KUBE_RELEASE:-}}"
release="${release#v}"
if [[ -z "$release" ]]; then
  release="$(releases | head -n 1)"
fi
# "1.37.2" selects 1.37 but must match the pinned patch version.
want_patch=""
if [[ "$release" =~ ^([0-9]+\.[0-9]+)\.([0-9]+)$ ]]; then
  release="${BASH_REMATCH[1]}"
  want_patch="v${BASH_REMATCH[0]}"
fi
modfile="releases/$release/go.mod"
sumfile="releases/$release/go.sum"
if [[ ! -f "$modfile" ]]; then
  echo "build.sh: unknown Kubernetes release '$release' (known: $(releases | tr '\n' ' '))" >&2
  exit 2
fi

# The Kubernetes version comes from the release's go.mod; stamped into /version.
kube_version="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$modfile")"
if [[ -z "$kube_version" ]]; then
  echo "build.sh: cannot find k8s.io/kubernetes version in $modfile" >&2
  exit 1
fi
if [[ -n "$want_patch" && "$want_patch" != "$kube_version" ]]; then
  echo "build.sh: release $release is pinned to $kube_version, not $want_patch (see releases/pin.sh)" >&2
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

gobuild harness "apiserver-harness-$release" "harness ($kube_version)" \
  "$modfile $sumfile $(ls *.go | LC_ALL=C sort)" -- \
  -modfile="$modfile" -trimpath -ldflags "$ldflags" .
