#!/usr/bin/env bash
# Builds the Go seed benchmark (benches/goseed) into a cache directory keyed by its sources, like
# the tests' Go builds, and prints the binary's path on the last line of stdout. A second run
# with unchanged sources prints the path without building. Benches only: not part of CI.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
. ../../tests/support/gobuild.sh

api="$(awk '$1 == "k8s.io/api" {print $2; exit}' go.mod)"
# -mod=readonly: go.mod/go.sum are the pins; a build never edits them or resolves new versions.
gobuild goseed goseed "Go seed ResourceSlice sync benchmark (k8s.io/api $api)" \
  "go.mod go.sum $(ls *.go | LC_ALL=C sort)" -- -mod=readonly -trimpath .
