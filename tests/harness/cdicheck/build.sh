#!/usr/bin/env bash
# Builds cdicheck (the upstream CDI library, tags.cncf.io/container-device-interface, at the
# version containerd v2.4.2 uses, reading the CDI specs python/nodeagent/sdk/cdi.py writes) into a
# cache directory keyed by the hash of its sources, and prints the binary's path on the last line
# of stdout. A second run with unchanged sources prints the path without building.
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

cdi="$(awk '$1 == "tags.cncf.io/container-device-interface" {print $2; exit}' go.mod)"
# -mod=readonly: go.mod/go.sum are the pins; a build never edits them or resolves new versions.
gobuild cdicheck cdicheck "cdicheck (tags.cncf.io/container-device-interface $cdi)" \
  "go.mod go.sum $(ls *.go | LC_ALL=C sort)" -- -mod=readonly -trimpath -ldflags "-s -w" .
