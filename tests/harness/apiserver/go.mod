// The harness is built per Kubernetes release with
// `go build -modfile=releases/<release>/go.mod` (build.sh); each release's
// go.mod and go.sum are written by releases/pin.sh. This file only marks the
// module root for the shared sources (*.go) and is never read by the build.
module nodeagent/tests/harness/apiserver

go 1.25.0
