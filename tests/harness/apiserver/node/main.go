// Command node runs an upstream kubelet or kube-scheduler of the same Kubernetes release as the
// apiserver harness (tests/harness/apiserver), for the real-node tests (tests/realnode).
//
//	node kubelet   [kubelet flags]
//	node scheduler [kube-scheduler flags]
//	node version
//
// Each subcommand is the body of k8s.io/kubernetes/cmd/kubelet/kubelet.go or
// cmd/kube-scheduler/scheduler.go; the version is stamped by build-node.sh like the
// harness's. See tests/support/realnode.py for the Python side.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // for client metric registration
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
	"k8s.io/component-base/version"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func usage() {
	fmt.Fprintf(os.Stderr, `usage:
  node kubelet   [kubelet flags]
  node scheduler [kube-scheduler flags]
  node version
`)
	os.Exit(2)
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	sub, args := os.Args[1], os.Args[2:]
	var cmd *cobra.Command
	switch sub {
	case "kubelet":
		cmd = kubelet.NewKubeletCommand(context.Background())
	case "scheduler":
		cmd = scheduler.NewSchedulerCommand()
	case "version":
		fmt.Println(version.Get().GitVersion)
		return
	default:
		fmt.Fprintf(os.Stderr, "unknown subcommand %q\n", sub)
		usage()
	}
	cmd.SetArgs(args)
	os.Exit(cli.Run(cmd))
}
