#!/usr/bin/env bash
# Builds the Katalyst reporter plugin (github.com/kubewharf/katalyst-api's skeleton and generated
# reporterplugin/v1alpha1 service, used unchanged) into a cache directory keyed by the hash of its
# sources, and prints the binary's path on the last line of stdout. A second run with unchanged
# sources prints the path without building.
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

api="$(awk '$1 == "github.com/kubewharf/katalyst-api" {print $2; exit}' go.mod)"
# -mod=readonly: go.mod/go.sum are the pins; a build never edits them or resolves new versions.
gobuild katalystplugin katalystplugin "katalystplugin (github.com/kubewharf/katalyst-api $api)" \
  "go.mod go.sum $(ls *.go | LC_ALL=C sort)" -- -mod=readonly -trimpath -ldflags "-s -w" .
