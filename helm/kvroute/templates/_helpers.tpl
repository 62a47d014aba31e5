{{/* Chart name, truncated to the DNS label limit. */}}
{{- define "kvroute.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name. */}}
{{- define "kvroute.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kvroute.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvroute.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvroute.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kvroute.labels" -}}
helm.sh/chart: {{ include "kvroute.chart" . }}
{{ include "kvroute.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: router
{{- end }}

{{- define "kvroute.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvroute.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kvroute.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The kvroute YAML config (router/config.cc: each key is a command-line option with '_' for '-'; `workers` is a
list of URLs or of maps {url, kv_events}). listen and admin_listen are passed as flags because the container
ports depend on them.
*/}}
{{- define "kvroute.config" -}}
{{- range $k := list "workers" "worker" "discover" "listen" "admin_listen" "config" }}
{{- if hasKey $.Values.config $k }}
{{- fail (printf "config.%s is set by the chart; use workers.* or service.* instead" $k) }}
{{- end }}
{{- end -}}
policy: {{ .Values.policy | quote }}
session_header: {{ .Values.session.header | quote }}
session_ttl: {{ .Values.session.ttlSeconds | quote }}
session_margin: {{ .Values.session.marginSeconds | quote }}
max_sessions: {{ .Values.session.maxSessions | quote }}
tenant_header: {{ .Values.session.tenantHeader | quote }}
health_interval: {{ .Values.health.intervalSeconds | quote }}
health_timeout: {{ .Values.health.timeoutSeconds | quote }}
unhealthy_threshold: {{ .Values.health.unhealthyThreshold | quote }}
healthy_threshold: {{ .Values.health.healthyThreshold | quote }}
{{- range $k, $v := .Values.config }}
{{ $k }}: {{ $v | quote }}
{{- end }}
{{- $pool := .Values.workers.pool }}
{{- $ns := default $.Release.Namespace $pool.namespace }}
{{- $poolByDns := and $pool.enabled $pool.discovery }}
{{- if or .Values.workers.discover $poolByDns }}
discover:
{{- range .Values.workers.discover }}
  - {{ . | quote }}
{{- end }}
{{- if $poolByDns }}
{{- $name := printf "%s.%s.svc.%s:%d" $pool.headlessService $ns $pool.clusterDomain (int $pool.port) }}
{{- if gt (int $pool.kvEventsPort) 0 }}
  - {{ printf "%s,kv_events_port=%d" $name (int $pool.kvEventsPort) | quote }}
{{- else }}
  - {{ $name | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- if or .Values.workers.urls (and $pool.enabled (not $pool.discovery)) }}
workers:
{{- range .Values.workers.urls }}
{{- if kindIs "map" . }}
  - url: {{ required "workers.urls[].url is required" .url | quote }}
    {{- if .kvEvents }}
    kv_events: {{ .kvEvents | quote }}
    {{- end }}
{{- else }}
  - url: {{ . | quote }}
{{- end }}
{{- end }}
{{- if and $pool.enabled (not $pool.discovery) }}
{{- range $i := until (int $pool.replicas) }}
{{- $host := printf "%s-%d.%s.%s.svc.%s" $pool.statefulSet $i $pool.headlessService $ns $pool.clusterDomain }}
  - url: {{ printf "%s://%s:%d" $pool.scheme $host (int $pool.port) | quote }}
    {{- if gt (int $pool.kvEventsPort) 0 }}
    kv_events: {{ printf "tcp://%s:%d" $host (int $pool.kvEventsPort) | quote }}
    {{- end }}
{{- end }}
{{- end }}
{{- else }}
workers: []
{{- end }}
{{- end }}
