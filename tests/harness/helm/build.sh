#!/usr/bin/env bash
# Builds the `helm` CLI (helm.sh/helm/v3, the version go.mod pins as its `tool`) from the Go module
# proxy into a cache directory keyed by the hash of this module's sources, and prints the binary's
# path on the last line of stdout. A second run with unchanged sources prints the path without
# building. tests/deploy lints, renders and applies deploy/helm/nodeagent with it, and
# scripts/render-manifests renders deploy/kubernetes from the chart with it.
#
# The link flags are those of helm's own Makefile: the version `helm version` reports, and the
# Kubernetes version `helm template` and `helm lint` assume without a cluster (.Capabilities,
# deprecation checks), taken from the k8s.io/client-go the module resolves (v0.N -> 1.N).
#
# Needs only Go and the Go module proxy; the default GOCACHE/GOMODCACHE are shared with the other
# Go builds of the tests. The build itself (Go, the cache directory keyed by the sources and the
# command line, the lock) is tests/support/gobuild.sh's.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
. ../../support/gobuild.sh

helm_version="$(awk '$1 == "helm.sh/helm/v3" {print $2; exit}' go.mod)"
client_go="$(awk '$1 == "k8s.io/client-go" {print $2; exit}' go.mod)"  # v0.37.0
kube_minor="$(cut -d. -f2 <<<"$client_go")"
if [[ -z "$helm_version" || -z "$kube_minor" ]]; then
  echo "build.sh: go.mod names no helm.sh/helm/v3 or k8s.io/client-go version" >&2
  exit 1
fi
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$kube_minor"
done
# -mod=readonly: go.mod/go.sum are the pins; a build never edits them or resolves new versions.
# CGO_ENABLED=0 as helm's releases are built.
gobuild helm helm "helm $helm_version (Kubernetes 1.$kube_minor)" "go.mod go.sum" -- \
  CGO_ENABLED=0 -mod=readonly -trimpath -ldflags "$ldflags" helm.sh/helm/v3/cmd/helm
