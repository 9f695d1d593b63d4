#!/usr/bin/env bash
# Builds the seed-era DRA plugin (upstream k8s.io/dynamic-resource-allocation v0.30 helper) into
# a cache directory keyed by the hash of its sources, and prints the binary's path on the last
# line of stdout. A second run with unchanged sources prints the path without building.
#
# Needs only Go and the Go module proxy. Uses the default GOCACHE/GOMODCACHE so Go's own caches
# are shared with the apiserver harness and across clones.
#
# The build itself (Go, the cache directory keyed by the sources and the command line, the lock)
# is tests/support/gobuild.sh's.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
. ../../support/gobuild.sh

helper="$(awk '$1 == "k8s.io/dynamic-resource-allocation" {print $2; exit}' go.mod)"
# -mod=readonly: go.mod/go.sum are the pins; a build never edits them or resolves new versions.
gobuild draplugin draplugin "draplugin (k8s.io/dynamic-resource-allocation $helper)" \
  "go.mod go.sum $(ls *.go | LC_ALL=C sort)" -- -mod=readonly -trimpath -ldflags "-s -w" .
