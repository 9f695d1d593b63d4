// The node binary (kubelet + kube-scheduler) is built per Kubernetes release with
// `go build -modfile=../releases/<release>/node.mod` (build-node.sh); each release's node.mod
// and node.sum are written by releases/pin.sh. This file only marks the module root (its own
// module, so the apiserver harness's go.mod never needs the kubelet's dependencies) and is
// never read by the build.
module nodeagent/tests/harness/apiserver/node

go 1.25.0
