// Command draplugin is a seed-era (Kubernetes 1.30) DRA kubelet plugin built from the upstream
// helper k8s.io/dynamic-resource-allocation/kubeletplugin v0.30, used unchanged, so the node agent
// is tested against a plugin no one on the project wrote. It registers the way real 1.30 drivers
// did (the layout of the 1.30 test driver and dra-example-driver):
//
//	registration socket  <registry-dir>/<driver>-reg.sock
//	service socket       <plugins-dir>/<driver>/dra.sock   (a directory of its own)
//
// and serves the v1alpha3 Node service. NodeListAndWatchResources sends the inventory read from
// --inventory (a JSON list of resource.k8s.io/v1alpha2 ResourceModel objects) and sends it again
// to every open stream after SIGHUP, which re-reads the file. SIGTERM or SIGINT stops the helper
// (it removes both sockets) and exits 0. Logs go to stderr (klog).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1alpha2"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1alpha3"
)

// inventory holds the current resources and wakes every stream when they change.
type inventory struct {
	mu        sync.Mutex
	resources []*resourceapi.ResourceModel
	// changed is closed (and replaced) on every update: a broadcast to all open streams.
	changed chan struct{}
}

func (inv *inventory) get() ([]*resourceapi.ResourceModel, <-chan struct{}) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	return inv.resources, inv.changed
}

func (inv *inventory) set(resources []*resourceapi.ResourceModel) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	inv.resources = resources
	close(inv.changed)
	inv.changed = make(chan struct{})
}

// readInventory decodes the file strictly: a typo in a field name is an error, not a silently
// empty attribute.
func readInventory(path string) ([]*resourceapi.ResourceModel, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var resources []*resourceapi.ResourceModel
	if err := dec.Decode(&resources); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return resources, nil
}

// nodeServer implements drapb.NodeServer (v1alpha3). Claims are prepared trivially: the agent
// never calls these, and the kubelet would only need some answer.
type nodeServer struct {
	inv *inventory
}

var _ drapb.NodeServer = &nodeServer{}

func (s *nodeServer) NodePrepareResources(_ context.Context, req *drapb.NodePrepareResourcesRequest) (*drapb.NodePrepareResourcesResponse, error) {
	resp := &drapb.NodePrepareResourcesResponse{Claims: map[string]*drapb.NodePrepareResourceResponse{}}
	for _, claim := range req.Claims {
		resp.Claims[claim.Uid] = &drapb.NodePrepareResourceResponse{}
	}
	return resp, nil
}

func (s *nodeServer) NodeUnprepareResources(_ context.Context, req *drapb.NodeUnprepareResourcesRequest) (*drapb.NodeUnprepareResourcesResponse, error) {
	resp := &drapb.NodeUnprepareResourcesResponse{Claims: map[string]*drapb.NodeUnprepareResourceResponse{}}
	for _, claim := range req.Claims {
		resp.Claims[claim.Uid] = &drapb.NodeUnprepareResourceResponse{}
	}
	return resp, nil
}

func (s *nodeServer) NodeListAndWatchResources(_ *drapb.NodeListAndWatchResourcesRequest, stream drapb.Node_NodeListAndWatchResourcesServer) error {
	logger := klog.Background().WithName("listwatch")
	for {
		resources, changed := s.inv.get()
		if err := stream.Send(&drapb.NodeListAndWatchResourcesResponse{Resources: resources}); err != nil {
			logger.Error(err, "send")
			return err
		}
		logger.Info("sent inventory", "resources", len(resources))
		select {
		case <-changed:
		case <-stream.Context().Done():
			logger.Info("stream closed", "reason", stream.Context().Err())
			return nil
		}
	}
}

func run() error {
	driver := flag.String("driver", "", "driver name (a DNS subdomain), required")
	registryDir := flag.String("registry-dir", "", "kubelet plugin registry directory (for <driver>-reg.sock), required")
	pluginsDir := flag.String("plugins-dir", "", "kubelet plugins directory (dra.sock goes in <plugins-dir>/<driver>/), required")
	inventoryPath := flag.String("inventory", "", "JSON file: a list of resource.k8s.io/v1alpha2 ResourceModel, required; re-read on SIGHUP")
	klog.InitFlags(nil)
	flag.Parse()
	for name, value := range map[string]string{"driver": *driver, "registry-dir": *registryDir, "plugins-dir": *pluginsDir, "inventory": *inventoryPath} {
		if value == "" {
			return fmt.Errorf("--%s is required", name)
		}
	}
	logger := klog.Background()

	resources, err := readInventory(*inventoryPath)
	if err != nil {
		return fmt.Errorf("--inventory: %w", err)
	}
	inv := &inventory{resources: resources, changed: make(chan struct{})}

	// As the 1.30 drivers did: the plugin directory is the driver's own; the registry directory
	// belongs to the kubelet (here: the agent), which creates it.
	pluginDir := filepath.Join(*pluginsDir, *driver)
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		return err
	}
	endpoint := filepath.Join(pluginDir, "dra.sock")

	// Signals are caught before the sockets exist, so a SIGHUP or SIGTERM sent as soon as the
	// registration socket appears is never the default action (which would kill the process).
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)

	plugin, err := kubeletplugin.Start(
		&nodeServer{inv: inv},
		kubeletplugin.DriverName(*driver),
		kubeletplugin.Logger(logger),
		kubeletplugin.RegistrarSocketPath(filepath.Join(*registryDir, *driver+"-reg.sock")),
		kubeletplugin.PluginSocketPath(endpoint),
		kubeletplugin.KubeletPluginSocketPath(endpoint),
	)
	if err != nil {
		return err
	}
	defer plugin.Stop()
	logger.Info("plugin started", "driver", *driver, "endpoint", endpoint, "resources", len(resources))

	for sig := range signals {
		if sig != syscall.SIGHUP {
			logger.Info("stopping", "signal", sig.String())
			return nil
		}
		resources, err := readInventory(*inventoryPath)
		if err != nil {
			// The last good inventory stays: a test (or an operator) sees the reason here.
			logger.Error(err, "SIGHUP: inventory not reloaded")
			continue
		}
		inv.set(resources)
		logger.Info("SIGHUP: inventory reloaded", "resources", len(resources))
	}
	return errors.New("signal channel closed")
}

func main() {
	if err := run(); err != nil {
		klog.Background().Error(err, "draplugin")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}
