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
list of URLs or of maps {url, kv_events, kv_events_replay, model, dp_size}). listen and admin_listen are passed as flags because the container
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
    {{- if .kvEventsReplay }}
    kv_events_replay: {{ .kvEventsReplay | quote }}
    {{- end }}
    {{- if .model }}
    model: {{ .model | quote }}
    {{- end }}
    {{- if .dpSize }}
    dp_size: {{ .dpSize | quote }}
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

{{/* Does any source give kvroute workers? ("true" or empty) */}}
{{- define "kvroute.hasWorkers" -}}
{{- $w := .Values.workers }}
{{- if or $w.urls $w.discover $w.discoverK8s $w.pool.enabled }}true{{ end }}
{{- end }}

{{/*
workers.discoverK8s entries as the flag wants them, NAMESPACE/SERVICE[:PORT_NAME] (the release namespace
when none is given), one per line.
*/}}
{{- define "kvroute.discoverK8s" -}}
{{- range .Values.workers.discoverK8s }}
{{- if contains "/" . }}
{{ . }}
{{- else }}
{{ printf "%s/%s" $.Release.Namespace . }}
{{- end }}
{{- end }}
{{- end }}

{{/* The namespaces whose EndpointSlices kvroute reads (a Role and RoleBinding in each), one per line. */}}
{{- define "kvroute.discoverK8sNamespaces" -}}
{{- $seen := dict }}
{{- range (include "kvroute.discoverK8s" . | trim | splitList "\n") }}
{{- $ns := first (splitList "/" .) }}
{{- if not (hasKey $seen $ns) }}
{{- $_ := set $seen $ns true }}
{{ $ns }}
{{- end }}
{{- end }}
{{- end }}

{{/* ---- Shared state (--shared-state, --shared-state-prefix): adjust here when the flags change ---- */}}
{{- define "kvroute.redisSelectorLabels" -}}
app.kubernetes.io/name: {{ include "kvroute.name" . }}-redis
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kvroute.redisFullname" -}}
{{- printf "%s-redis" (include "kvroute.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The Secret and key holding the Redis password kvroute uses ("NAME KEY"), or empty when none. */}}
{{- define "kvroute.redisPasswordRef" -}}
{{- $r := .Values.sharedState.redis }}
{{- if $r.url }}
{{- if $r.passwordSecret.name }}{{ $r.passwordSecret.name }} {{ $r.passwordSecret.key }}{{ end }}
{{- else if .Values.redis.enabled }}
{{- default (include "kvroute.redisFullname" .) .Values.redis.auth.existingSecret }} {{ .Values.redis.auth.key }}
{{- end }}
{{- end }}

{{/* "true" when replicas share state: forced by sharedState.enabled, else automatic for several replicas. */}}
{{- define "kvroute.sharedState" -}}
{{- $redis := or .Values.sharedState.redis.url .Values.redis.enabled }}
{{- $several := or (gt (int .Values.replicaCount) 1) .Values.autoscaling.enabled }}
{{- $on := .Values.sharedState.enabled }}
{{- if kindIs "invalid" $on }}{{ $on = and $redis $several }}{{ end }}
{{- if and $on (not $redis) }}
{{- fail "sharedState.enabled needs a Redis: set sharedState.redis.url or redis.enabled" }}
{{- end }}
{{- if $on }}true{{ end }}
{{- end }}

{{/* The Redis URL; the password comes from the environment ($(KVROUTE_REDIS_PASSWORD), expanded by Kubernetes). */}}
{{- define "kvroute.redisUrl" -}}
{{- $u := .Values.sharedState.redis.url }}
{{- if not $u }}
{{- $u = printf "redis://%s.%s.svc:6379" (include "kvroute.redisFullname" .) .Release.Namespace }}
{{- end }}
{{- if include "kvroute.redisPasswordRef" . }}
{{- $u = regexReplaceAll "^redis(s?)://" $u "redis${1}://:$(KVROUTE_REDIS_PASSWORD)@" }}
{{- end }}
{{- $u }}
{{- end }}

{{/* ---- Admin token (--admin-token-file): adjust here when the flag changes ---- */}}
{{- define "kvroute.adminTokenPath" -}}
/var/run/kvroute/admin-token/{{ .Values.admin.token.key }}
{{- end }}

{{/* ---- Client API keys (--api-keys-file) and TLS (--tls-cert, --tls-key) from Secrets ---- */}}
{{- define "kvroute.apiKeysPath" -}}
/var/run/kvroute/api-keys/{{ .Values.auth.apiKeys.key }}
{{- end }}
{{- define "kvroute.tlsDir" -}}
/var/run/kvroute/tls
{{- end }}
{{/* A probe of values.yaml, with scheme HTTPS when it reaches the api port and that port speaks TLS. */}}
{{- define "kvroute.probe" -}}
{{- $probe := deepCopy .probe }}
{{- if and .root.Values.tls.secretName $probe.httpGet (eq (toString $probe.httpGet.port) "api" (toString .root.Values.service.port)) }}
{{- $_ := set $probe.httpGet "scheme" "HTTPS" }}
{{- end }}
{{- toYaml $probe }}
{{- end }}

{{/* Flags of the optional features above, one list item per line (rendered into the container's args). */}}
{{- define "kvroute.featureArgs" -}}
{{- range (include "kvroute.discoverK8s" . | trim | splitList "\n" | compact) }}
- {{ printf "--discover-k8s=%s" . | quote }}
{{- end }}
{{- if include "kvroute.sharedState" . }}
- {{ printf "--shared-state=%s" (include "kvroute.redisUrl" .) | quote }}
- {{ printf "--shared-state-prefix=%s" (default (include "kvroute.fullname" .) .Values.sharedState.prefix) | quote }}
{{- end }}
{{- if .Values.admin.token.secretName }}
- {{ printf "--admin-token-file=%s" (include "kvroute.adminTokenPath" .) | quote }}
{{- end }}
{{- if .Values.auth.apiKeys.secretName }}
- {{ printf "--api-keys-file=%s" (include "kvroute.apiKeysPath" .) | quote }}
{{- end }}
{{- if .Values.tls.secretName }}
- {{ printf "--tls-cert=%s/tls.crt" (include "kvroute.tlsDir" .) | quote }}
- {{ printf "--tls-key=%s/tls.key" (include "kvroute.tlsDir" .) | quote }}
- "--admin-tls=false"
{{- end }}
{{- end }}
