{{/* Names, labels and the idemproxy config. */}}

{{- define "idemproxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "idemproxy.fullname" -}}
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

{{- define "idemproxy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "idemproxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "idemproxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "idemproxy.labels" -}}
{{ include "idemproxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ include "idemproxy.chart" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "idemproxy.secretName" -}}
{{- .Values.redis.existingSecret | default (printf "%s-redis" (include "idemproxy.fullname" .)) }}
{{- end }}

{{- define "idemproxy.endpoint" -}}
{{- printf "ipc://%s/%s" (trimSuffix "/" .Values.socket.dir) .Values.socket.name }}
{{- end }}

{{- define "idemproxy.passwordDir" -}}
/var/run/secrets/redis
{{- end }}

{{/*
The idemproxy config: .Values.config with the stream rules and what the pod
spec decides (the Redis URL and password file, the endpoint on the shared
emptyDir, the metrics address the probes use).
*/}}
{{- define "idemproxy.config" -}}
{{- $cfg := deepCopy (.Values.config | default dict) }}
{{- $redis := deepCopy (get $cfg "redis" | default dict) }}
{{- if .Values.redis.cluster }}
{{- $_ := set $redis "cluster" .Values.redis.cluster }}
{{- else }}
{{- $_ := set $redis "url" (required "redis.url is required" .Values.redis.url) }}
{{- end }}
{{- $_ := set $redis "password_file" (printf "%s/password" (include "idemproxy.passwordDir" .)) }}
{{- if .Values.redis.username }}
{{- $_ := set $redis "username" .Values.redis.username }}
{{- end }}
{{- $_ := set $cfg "redis" $redis }}
{{- $app := deepCopy (get $cfg "app" | default dict) }}
{{- $_ := set $app "endpoint" (include "idemproxy.endpoint" .) }}
{{- $_ := set $cfg "app" $app }}
{{- $metrics := deepCopy (get $cfg "metrics" | default dict) }}
{{- $_ := set $metrics "listen" (printf "0.0.0.0:%d" (int .Values.metrics.port)) }}
{{- $_ := set $cfg "metrics" $metrics }}
{{- if not .Values.streams }}
{{- fail "streams: at least one stream rule is required" }}
{{- end }}
{{- $_ := set $cfg "streams" .Values.streams }}
{{- toYaml $cfg }}
{{- end }}
