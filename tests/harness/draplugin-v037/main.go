// Command draplugin-v037 is a modern, self-publishing DRA driver built around the current upstream
// helper k8s.io/dynamic-resource-allocation/kubeletplugin v0.37, used unchanged, so the node agent
// is tested against a driver no one on the project wrote. Like every driver on that helper it
//
//   - registers with the plugin-registration protocol (<registry-dir>/<driver>-reg.sock) and lists
//     the services it serves in supported_versions: v1.DRAPlugin, v1beta1.DRAPlugin and, by the
//     helper's default, v1.DRAResourceHealth and v1alpha1.DRAResourceHealth;
//   - serves the DRA gRPC services on <plugin-data-dir>/dra.sock;
//   - publishes its own ResourceSlices (one pool, node-local, owned by the Node) with the helper's
//     ResourceSlice controller, using the credentials of --kubeconfig;
//   - waits for the registration status like real drivers do (Cilium's network driver,
//     dra-driver-memory): it polls Helper.RegistrationStatus() and exits 1 if the status does
//     not say registered within --registration-timeout.
//
// Every NotifyRegistrationStatus call the helper answers is logged (a gRPC interceptor, an
// option of the helper) as one line on stderr:
//
//	NotifyRegistrationStatus: registered=true error=""
//
// and the helper's recorded status, whenever it changes, as:
//
//	RegistrationStatus: registered=true error=""
//
// --rolling-update-uid turns on the helper's rolling updates (two instances of one driver at once,
// each with its own sockets, sharing --plugin-data-dir).
//
// --devices is a JSON list of resource.k8s.io/v1 Device objects (decoded strictly); SIGHUP
// re-reads it and publishes it ("SIGHUP: devices republished"). SIGTERM or SIGINT stops the
// helper (it removes both sockets, its slices stay) and exits 0. Logs go to stderr (klog).
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
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// driver implements kubeletplugin.DRAPlugin. Claims are prepared trivially: the agent never
// calls these, and a kubelet would only need some answer.
type driver struct {
	cancel context.CancelCauseFunc
}

var _ kubeletplugin.DRAPlugin = &driver{}

func (d *driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		result[claim.UID] = kubeletplugin.PrepareResult{}
	}
	return result, nil
}

func (d *driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	result := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		result[claim.UID] = nil
	}
	return result, nil
}

// HandleError follows the helper's recommendation: log, and stop on a fatal error.
func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg, "recoverable", errors.Is(err, kubeletplugin.ErrRecoverable))
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.cancel(fmt.Errorf("fatal: %s: %w", msg, err))
	}
}

func (d *driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// logRegistrationStatus records every NotifyRegistrationStatus call, whatever the helper makes
// of it, so a test sees each status a registrar sent (not only the last one).
func logRegistrationStatus(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if status, ok := req.(*registerapi.RegistrationStatus); ok {
		fmt.Fprintf(os.Stderr, "NotifyRegistrationStatus: registered=%t error=%q\n", status.PluginRegistered, status.Error)
	}
	return handler(ctx, req)
}

// readDevices decodes the file strictly: a typo in a field name is an error, not a silently
// missing attribute.
func readDevices(path string) ([]resourceapi.Device, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var devices []resourceapi.Device
	if err := dec.Decode(&devices); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return devices, nil
}

func resources(pool string, devices []resourceapi.Device) resourceslice.DriverResources {
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{
			pool: {Slices: []resourceslice.Slice{{Devices: devices}}},
		},
	}
}

// watchRegistrationStatus logs the helper's recorded status whenever it changes, and closes
// `registered` the first time it says registered.
func watchRegistrationStatus(ctx context.Context, helper *kubeletplugin.Helper, registered chan<- struct{}) {
	var last string
	once := sync.Once{}
	ticker := time.NewTicker(20 * time.Millisecond)
	defer ticker.Stop()
	for {
		if status := helper.RegistrationStatus(); status != nil {
			line := fmt.Sprintf("RegistrationStatus: registered=%t error=%q", status.PluginRegistered, status.Error)
			if line != last {
				fmt.Fprintln(os.Stderr, line)
				last = line
			}
			if status.PluginRegistered {
				once.Do(func() { close(registered) })
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

func main() {
	klog.InitFlags(nil)
	driverName := flag.String("driver", "", "driver name (required)")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file of the identity that writes the slices (required)")
	nodeName := flag.String("node-name", "", "node name: the slices' nodeName and owner (required)")
	registryDir := flag.String("registry-dir", kubeletplugin.KubeletRegistryDir, "directory of the registration socket")
	pluginDataDir := flag.String("plugin-data-dir", "", "directory of dra.sock (default /var/lib/kubelet/plugins/<driver>); created if missing")
	pool := flag.String("pool", "", "pool name (default: the node name)")
	devicesFile := flag.String("devices", "", "JSON file: list of resource.k8s.io/v1 Device objects (required)")
	registrationTimeout := flag.Duration("registration-timeout", 30*time.Second, "exit 1 if not registered within this time")
	rollingUpdateUID := flag.String("rolling-update-uid", "", "enable the helper's rolling updates with this pod UID (sockets <driver>-<uid>-reg.sock and dra-<uid>.sock)")
	flag.Parse()
	if *driverName == "" || *kubeconfig == "" || *nodeName == "" || *devicesFile == "" {
		fmt.Fprintln(os.Stderr, "draplugin-v037: --driver, --kubeconfig, --node-name and --devices are required")
		os.Exit(2)
	}
	if *pool == "" {
		*pool = *nodeName
	}
	if *pluginDataDir == "" {
		*pluginDataDir = kubeletplugin.KubeletPluginsDir + "/" + *driverName
	}
	if err := run(*driverName, *kubeconfig, *nodeName, *registryDir, *pluginDataDir, *pool, *devicesFile, *registrationTimeout, types.UID(*rollingUpdateUID)); err != nil {
		klog.ErrorS(err, "draplugin-v037 failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

func run(driverName, kubeconfig, nodeName, registryDir, pluginDataDir, pool, devicesFile string, registrationTimeout time.Duration, rollingUpdateUID types.UID) error {
	devices, err := readDevices(devicesFile)
	if err != nil {
		return err
	}
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	config.UserAgent = "draplugin-v037"
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	// The helper requires both directories to exist (a DaemonSet mounts them).
	if err := os.MkdirAll(pluginDataDir, 0o750); err != nil {
		return err
	}

	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)

	d := &driver{cancel: cancel}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(driverName),
		kubeletplugin.NodeName(nodeName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(registryDir),
		kubeletplugin.PluginDataDirectoryPath(pluginDataDir),
		kubeletplugin.GRPCInterceptor(logRegistrationStatus),
		// Empty: off (the helper's default socket names).
		kubeletplugin.RollingUpdate(rollingUpdateUID),
	)
	if err != nil {
		return fmt.Errorf("start helper: %w", err)
	}
	defer helper.Stop()
	if err := helper.PublishResources(ctx, resources(pool, devices)); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	klog.InfoS("serving", "driver", driverName, "registry", registryDir, "pluginData", pluginDataDir, "pool", pool, "devices", len(devices))

	registered := make(chan struct{})
	go watchRegistrationStatus(ctx, helper, registered)
	timeout := time.After(registrationTimeout)
	for {
		select {
		case <-registered:
			registered = nil
			timeout = nil
		case <-timeout:
			return fmt.Errorf("not registered within %s (last status: %+v)", registrationTimeout, helper.RegistrationStatus())
		case <-ctx.Done():
			return context.Cause(ctx)
		case sig := <-signals:
			if sig != syscall.SIGHUP {
				klog.InfoS("stopping", "signal", sig.String())
				return nil
			}
			devices, err := readDevices(devicesFile)
			if err != nil {
				klog.ErrorS(err, "devices not republished; keeping the last ones")
				continue
			}
			if err := helper.PublishResources(ctx, resources(pool, devices)); err != nil {
				return fmt.Errorf("publish: %w", err)
			}
			fmt.Fprintln(os.Stderr, "SIGHUP: devices republished")
		}
	}
}
