// Command cdicheck reads CDI spec files with the upstream CDI library
// (tags.cncf.io/container-device-interface, the one containerd and CRI-O use), for the tests of
// python/nodeagent/sdk/cdi.py. It prints JSON on stdout.
//
//	cdicheck validate FILE
//	    {"minimumVersion": "...", "deviceMinimumVersions": [...], "version": "...",
//	    "error": "..."}: the file read as the library's cache reads it (cdi.ReadSpec: parse,
//	    version check, names, edits), specs-go's MinimumRequiredVersion of the parsed spec,
//	    and of the spec with each device alone (see below). Exit 0 also when the spec is
//	    invalid (the error says why); exit 2 on a usage error.
//	cdicheck inject --spec-dir DIR DEVICE_ID...
//	    a cache over DIR (no auto-refresh) injects the qualified devices into an empty OCI spec
//	    and prints the spec; {"error": "...", "unresolved": [...], "specErrors": {...}} and exit
//	    1 when a device is not found or the injection fails.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "validate":
		if len(os.Args) != 3 {
			usage()
		}
		validate(os.Args[2])
	case "inject":
		if len(os.Args) < 4 || os.Args[2] != "--spec-dir" {
			usage()
		}
		inject(os.Args[3], os.Args[4:])
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: cdicheck validate FILE | cdicheck inject --spec-dir DIR DEVICE_ID...")
	os.Exit(2)
}

func emit(v any) {
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		fmt.Fprintln(os.Stderr, "cdicheck:", err)
		os.Exit(3)
	}
}

type validateResult struct {
	MinimumVersion string `json:"minimumVersion"`
	// MinimumRequiredVersion of the spec with only this device: the library's rules for each
	// device. specs-go v1.1.1 (its go.mod says go 1.19: a loop variable is shared by all
	// iterations) collects &d.ContainerEdits in a range loop, so for the whole spec it sees the
	// last device's edits only for mount types (0.4.0) and device node host paths (0.5.0).
	DeviceMinimumVersions []string `json:"deviceMinimumVersions"`
	Version               string   `json:"version"`
	Error                 string   `json:"error"`
}

func validate(path string) {
	var result validateResult
	data, err := os.ReadFile(path)
	if err != nil {
		result.Error = err.Error()
		emit(result)
		return
	}
	raw, err := cdi.ParseSpec(data)
	if err != nil {
		result.Error = err.Error()
		emit(result)
		return
	}
	if raw == nil {
		result.Error = "no Spec data"
		emit(result)
		return
	}
	result.Version = raw.Version
	if result.MinimumVersion, err = specs.MinimumRequiredVersion(raw); err != nil {
		result.Error = err.Error()
		emit(result)
		return
	}
	result.DeviceMinimumVersions = []string{}
	for _, d := range raw.Devices {
		alone := *raw
		alone.Devices = []specs.Device{d}
		v, err := specs.MinimumRequiredVersion(&alone)
		if err != nil {
			result.Error = err.Error()
			emit(result)
			return
		}
		result.DeviceMinimumVersions = append(result.DeviceMinimumVersions, v)
	}
	// ReadSpec is what the cache runs on every file of its directories: parse and validate.
	if _, err := cdi.ReadSpec(path, 0); err != nil {
		result.Error = err.Error()
	}
	emit(result)
}

type injectError struct {
	Error      string              `json:"error"`
	Unresolved []string            `json:"unresolved"`
	SpecErrors map[string][]string `json:"specErrors"`
}

func inject(dir string, devices []string) {
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	specErrors := map[string][]string{}
	if cache != nil {
		for path, errs := range cache.GetErrors() {
			for _, e := range errs {
				specErrors[path] = append(specErrors[path], e.Error())
			}
		}
	}
	if cache == nil {
		emit(injectError{Error: fmt.Sprintf("NewCache: %v", err), Unresolved: devices, SpecErrors: specErrors})
		os.Exit(1)
	}
	// NewCache's error is the spec files' errors (GetErrors): a file it refused does not stop
	// the devices of the others from resolving, as in a runtime.
	spec := oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	unresolved, err := cache.InjectDevices(&spec, devices...)
	if err != nil {
		sort.Strings(unresolved)
		emit(injectError{Error: err.Error(), Unresolved: unresolved, SpecErrors: specErrors})
		os.Exit(1)
	}
	emit(spec)
}
