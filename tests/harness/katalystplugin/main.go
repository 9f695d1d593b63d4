// Command katalystplugin is a Katalyst reporter plugin built on github.com/kubewharf/katalyst-api,
// used unchanged, so the node agent's reporter side is tested against a plugin no one on the
// project wrote: the skeleton's PluginRegistrationWrapper (pkg/plugins/skeleton) serves the
// kubelet pluginregistration v1 Registration service (from pkg/plugins/registration: type
// "ReporterPlugin", versions ["v1alpha1"], no endpoint) and the generated
// reporterplugin.v1alpha1 ReporterPlugin service on one socket, <plugin-dir>/<name>.sock, exactly
// as Katalyst's out-of-tree reporters do.
//
// What it reports comes from --content, a JSON file in the form of GetReportContentResponse
// except that each field's value is inline JSON (sent as its compact bytes) and the field type
// is its name:
//
//	{"content": [{"groupVersionKind": {"group": "node.katalyst.kubewharf.io",
//	  "version": "v1alpha1", "kind": "CustomNodeResource"},
//	  "field": [{"fieldType": "Status", "fieldName": "TopologyPolicy", "value": "None"}]}]}
//
// GetReportContent answers the current content; ListAndWatchReportContent sends it when the
// stream opens and again to every open stream after SIGHUP, which re-reads the file (a bad file
// is logged and the last good content kept). SIGTERM or SIGINT stops the wrapper (it removes the
// socket) and exits 0. Logs go to stderr (klog).
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

	"github.com/kubewharf/katalyst-api/pkg/plugins/skeleton"
	"github.com/kubewharf/katalyst-api/pkg/protocol/reporterplugin/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// store holds the current content and wakes every stream when it changes.
type store struct {
	mu      sync.Mutex
	content []*v1alpha1.ReportContent
	version int
	// changed is closed (and replaced) on every update: a broadcast to all open streams.
	changed chan struct{}
}

func (s *store) get() ([]*v1alpha1.ReportContent, int, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.content, s.version, s.changed
}

func (s *store) set(content []*v1alpha1.ReportContent) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.content = content
	s.version++
	close(s.changed)
	s.changed = make(chan struct{})
	return s.version
}

type fileField struct {
	FieldType string          `json:"fieldType"`
	FieldName string          `json:"fieldName"`
	Value     json.RawMessage `json:"value"`
}

type fileContent struct {
	GroupVersionKind *metav1.GroupVersionKind `json:"groupVersionKind"`
	Field            []fileField              `json:"field"`
}

type fileDoc struct {
	Content []fileContent `json:"content"`
}

// readContent decodes the file strictly (a misspelt key is an error, not a silently empty
// field) and turns it into the upstream messages.
func readContent(path string) ([]*v1alpha1.ReportContent, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var doc fileDoc
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := make([]*v1alpha1.ReportContent, 0, len(doc.Content))
	for i, c := range doc.Content {
		if c.GroupVersionKind == nil {
			return nil, fmt.Errorf("%s: content[%d].groupVersionKind: required", path, i)
		}
		fields := make([]*v1alpha1.ReportField, 0, len(c.Field))
		for j, f := range c.Field {
			fieldType, ok := v1alpha1.FieldType_value[f.FieldType]
			if !ok {
				return nil, fmt.Errorf("%s: content[%d].field[%d].fieldType: %q is not one of Spec, Status, Metadata", path, i, j, f.FieldType)
			}
			var value bytes.Buffer
			if err := json.Compact(&value, f.Value); err != nil {
				return nil, fmt.Errorf("%s: content[%d].field[%d].value: %w", path, i, j, err)
			}
			fields = append(fields, &v1alpha1.ReportField{
				FieldType: v1alpha1.FieldType(fieldType),
				FieldName: f.FieldName,
				Value:     value.Bytes(),
			})
		}
		out = append(out, &v1alpha1.ReportContent{GroupVersionKind: c.GroupVersionKind, Field: fields})
	}
	return out, nil
}

// reporter implements skeleton.ReporterPlugin: the skeleton's GenericPlugin (Name/Start/Stop,
// reentrant as the wrapper requires) and the generated ReporterPluginServer.
type reporter struct {
	name  string
	store *store

	mu   sync.Mutex
	stop chan struct{} // nil while stopped
}

var _ skeleton.ReporterPlugin = &reporter{}

func (r *reporter) Name() string { return r.name }

func (r *reporter) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stop == nil {
		r.stop = make(chan struct{})
	}
	return nil
}

func (r *reporter) Stop() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stop != nil {
		close(r.stop)
		r.stop = nil
	}
	return nil
}

func (r *reporter) stopped() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stop == nil {
		closed := make(chan struct{})
		close(closed)
		return closed
	}
	return r.stop
}

func (r *reporter) GetReportContent(_ context.Context, _ *v1alpha1.Empty) (*v1alpha1.GetReportContentResponse, error) {
	content, _, _ := r.store.get()
	return &v1alpha1.GetReportContentResponse{Content: content}, nil
}

func (r *reporter) ListAndWatchReportContent(_ *v1alpha1.Empty, server v1alpha1.ReporterPlugin_ListAndWatchReportContentServer) error {
	stop := r.stopped()
	for {
		content, version, changed := r.store.get()
		if err := server.Send(&v1alpha1.GetReportContentResponse{Content: content}); err != nil {
			klog.Errorf("ListAndWatchReportContent: sending version %d: %v", version, err)
			return err
		}
		klog.Infof("ListAndWatchReportContent: sent version %d", version)
		select {
		case <-changed:
		case <-stop:
			return nil
		case <-server.Context().Done():
			return nil
		}
	}
}

func main() {
	klog.InitFlags(nil)
	name := flag.String("name", "", "plugin name: the socket is <plugin-dir>/<name>.sock (required)")
	pluginDir := flag.String("plugin-dir", "", "the agent's plugin registration directory (required)")
	contentPath := flag.String("content", "", "JSON file of what to report (required)")
	flag.Parse()
	if *name == "" || *pluginDir == "" || *contentPath == "" {
		fmt.Fprintln(os.Stderr, "katalystplugin: --name, --plugin-dir and --content are required")
		os.Exit(2)
	}
	if err := run(*name, *pluginDir, *contentPath); err != nil {
		klog.Errorf("katalystplugin: %v", err)
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

func run(name, pluginDir, contentPath string) error {
	content, err := readContent(contentPath)
	if err != nil {
		return err
	}
	st := &store{content: content, changed: make(chan struct{})}
	plugin := &reporter{name: name, store: st}
	wrapper, err := skeleton.NewRegistrationPluginWrapper(plugin, []string{pluginDir}, func(key string, value int64) {
		klog.Infof("skeleton metric %s=%d", key, value)
	})
	if err != nil {
		return err
	}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	// Start only launches the wrapper's (re)start loop; the socket appears once it serves.
	if err := wrapper.Start(); err != nil {
		return err
	}
	for sig := range signals {
		if sig != syscall.SIGHUP {
			klog.Infof("%v: stopping", sig)
			if err := wrapper.Stop(); err != nil {
				return errors.Join(fmt.Errorf("stopping the skeleton wrapper"), err)
			}
			return nil
		}
		content, err := readContent(contentPath)
		if err != nil {
			klog.Errorf("SIGHUP: content not reloaded, keeping the last good content: %v", err)
			continue
		}
		klog.Infof("SIGHUP: content reloaded (version %d)", st.set(content))
	}
	return nil
}
