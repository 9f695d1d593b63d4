package main

import (
	"fmt"
	"path/filepath"

	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

// runAPIServer runs the real kube-apiserver (its cobra command, in-process)
// against the etcd started by `harness etcd`, serving on 127.0.0.1:--port.
// Anything after `--` is appended to the kube-apiserver flags, so a test can
// override a default (the last occurrence of a flag wins).
func runAPIServer(args []string) error {
	fs := newFlagSet("apiserver")
	dir := fs.String("dir", "", "harness directory written by `harness certs` (required)")
	etcd := fs.String("etcd", "http://127.0.0.1:2379", "etcd client URL")
	port := fs.Int("port", 6443, "secure port on 127.0.0.1")
	verbosity := fs.Int("v", 0, "kube-apiserver log verbosity")
	_ = fs.Parse(args)
	if *dir == "" {
		return fmt.Errorf("--dir is required")
	}
	d, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	p := func(name string) string { return filepath.Join(d, name) }

	kargs := []string{
		"--etcd-servers=" + *etcd,
		"--etcd-prefix=/registry",
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", *port),
		"--cert-dir=" + p("apiserver-certs"),
		"--tls-cert-file=" + p("apiserver.crt"),
		"--tls-private-key-file=" + p("apiserver.key"),
		"--client-ca-file=" + p("ca.crt"),
		"--token-auth-file=" + p("tokens.csv"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p("sa.pub"),
		"--service-account-signing-key-file=" + p("sa.key"),
		"--api-audiences=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=Node,RBAC",
		"--anonymous-auth=false",
		"--enable-admission-plugins=NodeRestriction",
		// ServiceAccount admission rejects pods until a controller-manager
		// has created the namespace's default ServiceAccount; there is none.
		"--disable-admission-plugins=ServiceAccount",
		"--runtime-config=resource.k8s.io/v1=true",
		"--allow-privileged=true",
		// No kubernetes Service endpoints for a loopback address.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
		"--event-ttl=10m",
		fmt.Sprintf("--v=%d", *verbosity),
	}
	kargs = append(kargs, fs.Args()...)

	cmd := app.NewAPIServerCommand()
	cmd.SetArgs(kargs)
	return cmd.Execute()
}
