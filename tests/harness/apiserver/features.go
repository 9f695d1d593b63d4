package main

import (
	"encoding/json"
	"os"
	"sort"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"
	"k8s.io/kubernetes/pkg/api/legacyscheme"

	// Registers kube-apiserver's own gates; the app package imports it too,
	// this only says why GetAll sees them.
	_ "k8s.io/kubernetes/pkg/features"
)

type featureInfo struct {
	Name       string   `json:"name"`
	Default    bool     `json:"default"`
	PreRelease string   `json:"preRelease"`
	Locked     bool     `json:"locked"`
	DependsOn  []string `json:"dependsOn,omitempty"`
}

type featuresOut struct {
	// ResourceVersions are the resource.k8s.io API versions this release
	// serves (or can be told to serve with --runtime-config), preferred first.
	ResourceVersions []string `json:"resourceVersions"`
	// APIVersions are the same for the groups a DRA gate's dependencies use
	// (GenericWorkload: scheduling.k8s.io's Workload and PodGroup, whose
	// informers keep /readyz failing while their alpha API is off).
	APIVersions map[string][]string `json:"apiVersions"`
	Features    []featureInfo       `json:"features"`
}

var apiGroups = []string{"resource.k8s.io", "scheduling.k8s.io"}

// runFeatures prints, as JSON, every feature gate kube-apiserver knows at the
// binary's own version (default, maturity, locked, dependencies) and the
// resource.k8s.io versions, so a test can turn on a family of gates by name
// without passing a locked one (which the apiserver rejects).
func runFeatures(args []string) error {
	fs := newFlagSet("features")
	_ = fs.Parse(args)

	gate := utilfeature.DefaultMutableFeatureGate
	// Dependencies() exists from 1.36 on; 1.35 declares none.
	var deps map[featuregate.Feature][]featuregate.Feature
	if d, ok := any(gate).(interface {
		Dependencies() map[featuregate.Feature][]featuregate.Feature
	}); ok {
		deps = d.Dependencies()
	}
	out := featuresOut{ResourceVersions: []string{}, APIVersions: map[string][]string{}}
	for name, spec := range gate.GetAll() {
		fi := featureInfo{
			Name:       string(name),
			Default:    spec.Default,
			PreRelease: string(spec.PreRelease),
			Locked:     spec.LockToDefault,
		}
		for _, dep := range deps[name] {
			fi.DependsOn = append(fi.DependsOn, string(dep))
		}
		sort.Strings(fi.DependsOn)
		out.Features = append(out.Features, fi)
	}
	sort.Slice(out.Features, func(i, j int) bool { return out.Features[i].Name < out.Features[j].Name })
	for _, group := range apiGroups {
		versions := []string{}
		for _, gv := range legacyscheme.Scheme.PrioritizedVersionsForGroup(group) {
			versions = append(versions, gv.Version)
		}
		out.APIVersions[group] = versions
	}
	out.ResourceVersions = out.APIVersions["resource.k8s.io"]
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
