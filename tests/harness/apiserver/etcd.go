package main

import (
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// runEtcd runs a single-member embedded etcd on loopback until SIGTERM/SIGINT.
// The client URL also serves etcd's JSON gRPC gateway (/v3/kv/range,
// /v3/kv/compaction, ...), which the Python side uses to compact.
func runEtcd(args []string) error {
	fs := newFlagSet("etcd")
	dir := fs.String("dir", "", "harness directory; data goes to DIR/etcd (required)")
	clientPort := fs.Int("client-port", 2379, "client port on 127.0.0.1")
	peerPort := fs.Int("peer-port", 2380, "peer port on 127.0.0.1")
	fsync := fs.Bool("fsync", false, "fsync the WAL (off by default: test data, faster on a busy machine)")
	logLevel := fs.String("log-level", "error", "etcd log level")
	_ = fs.Parse(args)
	if *dir == "" {
		return fmt.Errorf("--dir is required")
	}

	cu, err := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", *clientPort))
	if err != nil {
		return err
	}
	pu, err := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", *peerPort))
	if err != nil {
		return err
	}

	cfg := embed.NewConfig()
	cfg.Name = "harness"
	cfg.Dir = filepath.Join(*dir, "etcd")
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.EnableGRPCGateway = true
	cfg.UnsafeNoFsync = !*fsync
	cfg.LogLevel = *logLevel
	cfg.LogOutputs = []string{"stderr"}

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	defer e.Close()

	select {
	case <-e.Server.ReadyNotify():
		fmt.Printf("etcd ready on %s\n", cu)
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		return fmt.Errorf("etcd took too long to start")
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case s := <-sig:
		fmt.Printf("etcd: got %v, stopping\n", s)
		return nil
	case err := <-e.Err():
		return err
	}
}
