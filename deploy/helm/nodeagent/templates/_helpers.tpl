{{/* The objects' base name: the release name when it contains the chart's name (so
`helm install nodeagent` names everything "nodeagent"), else "<release>-<chart>". */}}
{{- define "nodeagent.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "nodeagent.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "nodeagent.fullname" .) -}}
{{- end -}}

{{/* The user name the apiserver gives the pods' tokens: what the admission policies match. */}}
{{- define "nodeagent.serviceAccountUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "nodeagent.serviceAccountName" .) -}}
{{- end -}}

{{- define "nodeagent.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Every object's labels. chartLabels: false (the plain manifests) leaves out the ones that
say Helm manages the object. */}}
{{- define "nodeagent.labels" -}}
{{ include "nodeagent.selectorLabels" . }}
{{- if .Values.chartLabels }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The image of the agent's pods and the rollout controller's (deploy/image/build.sh builds it:
docker.io/library/nodeagent:<version>), pushed to a registry or loaded into every node's runtime
(docs/operating/container-image.md); the chart has no default repository. A test keeps the
appVersion equal to the version. */}}
{{- define "nodeagent.image" -}}
{{- $missing := "image.repository is required: the nodeagent image is in no public registry. Build it (sudo bash deploy/image/build.sh), then push it to a registry the nodes pull from and set image.repository to it, or load dist/image/nodeagent-oci.tar on every node (containerd: ctr -n k8s.io images import nodeagent-oci.tar; kind: kind load image-archive) and set image.repository=docker.io/library/nodeagent (docs/operating/container-image.md)" -}}
{{- printf "%s:%s" (required $missing .Values.image.repository) (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The node a pod-bound service-account token names (empty for any other token). */}}
{{- define "nodeagent.tokenNodeVariable" -}}
- name: node
  expression: >-
    'authentication.kubernetes.io/node-name' in request.userInfo.extra
    ? request.userInfo.extra['authentication.kubernetes.io/node-name'][0] : ''
{{- end -}}

{{/*
The agent's configuration file from .Values.config, as TOML. Helm's own toToml is not used:
values reach templates as float64, and toToml writes 5 as 5.0, which the agent's integer fields
refuse. Here an integral number is written as an integer (its float fields take integers),
strings as JSON strings (valid TOML basic strings), lists inline, maps as [tables].
*/}}
{{- define "nodeagent.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}{{ . }}{{- else -}}{{ toJson . }}{{- end -}}
{{- end -}}

{{- define "nodeagent.toml.value" -}}
{{- $v := . -}}
{{- if kindIs "string" $v -}}{{ toJson $v }}
{{- else if kindIs "bool" $v -}}{{ $v }}
{{- else if or (kindIs "int" $v) (kindIs "int64" $v) -}}{{ printf "%d" $v }}
{{- else if kindIs "float64" $v -}}
{{- if and (lt $v 9.007199254740992e15) (gt $v -9.007199254740992e15) (eq (float64 (int64 $v)) $v) -}}{{ printf "%d" (int64 $v) }}
{{- else -}}{{ toJson $v }}{{- end -}}
{{- else if kindIs "slice" $v -}}
[{{- range $i, $item := $v -}}{{ if $i }}, {{ end }}{{ include "nodeagent.toml.value" $item }}{{- end -}}]
{{- else if kindIs "map" $v -}}
{ {{- range $i, $k := keys $v | sortAlpha -}}{{ if $i }}, {{ end }}{{ include "nodeagent.toml.key" $k }} = {{ include "nodeagent.toml.value" (get $v $k) }}{{- end -}} }
{{- else if kindIs "invalid" $v -}}
{{- fail "config: TOML has no null; leave the key out for its default" -}}
{{- else -}}
{{- fail (printf "config: a value of kind %s has no TOML form" (kindOf $v)) -}}
{{- end -}}
{{- end -}}

{{/* dict "path" (list of the table's keys) "table" (its map) */}}
{{- define "nodeagent.toml.table" -}}
{{- $path := .path -}}
{{- $table := .table -}}
{{- range $k := keys $table | sortAlpha -}}
{{- $v := get $table $k -}}
{{- if kindIs "invalid" $v -}}
{{- fail (printf "config.%s: TOML has no null; leave the key out for its default" (join "." (append $path $k))) -}}
{{- end -}}
{{- if not (kindIs "map" $v) }}
{{ include "nodeagent.toml.key" $k }} = {{ include "nodeagent.toml.value" $v }}
{{- end -}}
{{- end -}}
{{- range $k := keys $table | sortAlpha -}}
{{- $v := get $table $k -}}
{{- if kindIs "map" $v -}}
{{- $sub := append $path $k }}
{{- $keys := list -}}
{{- range $sub }}{{ $keys = append $keys (include "nodeagent.toml.key" .) }}{{ end }}

[{{ join "." $keys }}]
{{- include "nodeagent.toml.table" (dict "path" $sub "table" $v) -}}
{{- end -}}
{{- end -}}
{{- end -}}
