// Command harness runs a real kube-apiserver backed by an embedded etcd on
// loopback, for nodeagent's integration tests.
//
//	harness certs     --dir D --nodes node-a,node-b --server https://127.0.0.1:N
//	harness etcd      --dir D --client-port P --peer-port Q
//	harness apiserver --dir D --etcd http://127.0.0.1:P --port N
//	harness features
//
// See tests/support/apiserver.py for the Python side.
package main

import (
	"flag"
	"fmt"
	"os"
)

func usage() {
	fmt.Fprintf(os.Stderr, `usage:
  harness certs     --dir D [--nodes node-a,node-b] [--server https://127.0.0.1:6443]
  harness etcd      --dir D --client-port P --peer-port Q
  harness apiserver --dir D --etcd http://127.0.0.1:P --port N [-- extra kube-apiserver flags]
  harness features  (JSON: kube-apiserver's feature gates and resource.k8s.io versions)
`)
	os.Exit(2)
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	sub, args := os.Args[1], os.Args[2:]
	var err error
	switch sub {
	case "certs":
		err = runCerts(args)
	case "etcd":
		err = runEtcd(args)
	case "apiserver":
		err = runAPIServer(args)
	case "features":
		err = runFeatures(args)
	case "-h", "--help", "help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "unknown subcommand %q\n", sub)
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "harness %s: %v\n", sub, err)
		os.Exit(1)
	}
}

func newFlagSet(name string) *flag.FlagSet {
	return flag.NewFlagSet("harness "+name, flag.ExitOnError)
}
