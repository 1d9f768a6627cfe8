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

{{- define "idemproxy.sentinelPasswordDir" -}}
/var/run/secrets/redis-sentinel
{{- end }}

{{- define "idemproxy.sentinelSecretName" -}}
{{- .Values.redis.sentinel.existingSecret | default (printf "%s-redis-sentinel" (include "idemproxy.fullname" .)) }}
{{- end }}

{{/* "true" when redis.sentinel.masterName is set: the sentinels name the master. */}}
{{- define "idemproxy.sentinelEnabled" -}}
{{- if (.Values.redis.sentinel | default dict).masterName }}true{{ end }}
{{- end }}

{{/* "true" when the sentinels have a password (a Secret to mount), else empty. */}}
{{- define "idemproxy.sentinelHasPassword" -}}
{{- $s := .Values.redis.sentinel | default dict }}
{{- if and $s.masterName (or $s.existingSecret $s.password) }}true{{ end }}
{{- end }}

{{- define "idemproxy.tlsDir" -}}
/var/run/secrets/redis-tls
{{- end }}

{{/* "true" when a password is configured (a Secret to mount), else empty: no AUTH. */}}
{{- define "idemproxy.hasPassword" -}}
{{- if or .Values.redis.existingSecret .Values.redis.password }}true{{ end }}
{{- end }}

{{/* "true" when idemproxy talks TLS to Redis: redis.tls.enabled, or a rediss://
url (with neither Sentinel nor cluster seeds, where the url is not used). */}}
{{- define "idemproxy.tlsOn" -}}
{{- $tls := .Values.redis.tls | default dict }}
{{- $urlMode := not (or (include "idemproxy.sentinelEnabled" .) .Values.redis.cluster) }}
{{- if or $tls.enabled (and $urlMode (hasPrefix "rediss://" (.Values.redis.url | default ""))) }}true{{ end }}
{{- end }}

{{/* "true" when a TLS Secret (ca.crt, maybe tls.crt/tls.key) is mounted; TLS
without one verifies against the image's CA bundle. */}}
{{- define "idemproxy.tlsSecret" -}}
{{- if and (include "idemproxy.tlsOn" .) (.Values.redis.tls | default dict).existingSecret }}true{{ end }}
{{- end }}

{{/*
The idemproxy config: .Values.config with the stream rules and what the pod
spec decides (the Redis URL, password file and TLS files, the endpoint on the
shared emptyDir, the metrics address the probes use).
*/}}
{{- define "idemproxy.config" -}}
{{- $cfg := deepCopy (.Values.config | default dict) }}
{{- $redis := deepCopy (get $cfg "redis" | default dict) }}
{{- $tls := .Values.redis.tls | default dict }}
{{- if include "idemproxy.sentinelEnabled" . }}
{{- $s := .Values.redis.sentinel }}
{{- if .Values.redis.cluster }}
{{- fail "redis.sentinel.masterName and redis.cluster are both set: use one" }}
{{- end }}
{{- $sn := dict "master_name" $s.masterName "sentinels" (required "redis.sentinel.sentinels: at least one host:port is needed with redis.sentinel.masterName" $s.sentinels) }}
{{- if $s.username }}
{{- $_ := set $sn "username" $s.username }}
{{- end }}
{{- if include "idemproxy.sentinelHasPassword" . }}
{{- $_ := set $sn "password_file" (printf "%s/password" (include "idemproxy.sentinelPasswordDir" .)) }}
{{- else if $s.username }}
{{- fail "redis.sentinel.username needs a password: set redis.sentinel.password or redis.sentinel.existingSecret" }}
{{- end }}
{{- $_ := set $redis "sentinel" $sn }}
{{- else if .Values.redis.cluster }}
{{- $_ := set $redis "cluster" .Values.redis.cluster }}
{{- else }}
{{- $url := required "redis.url is required" .Values.redis.url }}
{{- if and $tls.enabled (hasPrefix "unix://" $url) }}
{{- fail "redis.tls.enabled needs a redis:// or rediss:// url, not unix://" }}
{{- end }}
{{- if $tls.enabled }}
{{- $url = printf "rediss://%s" (trimPrefix "rediss://" (trimPrefix "redis://" $url)) }}
{{- end }}
{{- $_ := set $redis "url" $url }}
{{- end }}
{{- if include "idemproxy.hasPassword" . }}
{{- $_ := set $redis "password_file" (printf "%s/password" (include "idemproxy.passwordDir" .)) }}
{{- else if .Values.redis.username }}
{{- fail "redis.username needs a password: set redis.password or redis.existingSecret" }}
{{- end }}
{{- if .Values.redis.username }}
{{- $_ := set $redis "username" .Values.redis.username }}
{{- end }}
{{- if include "idemproxy.tlsOn" . }}
{{- $dir := include "idemproxy.tlsDir" . }}
{{- $t := dict }}
{{- if include "idemproxy.tlsSecret" . }}
{{- $_ := set $t "ca_file" (printf "%s/ca.crt" $dir) }}
{{- if $tls.clientCertificate }}
{{- $_ := set $t "cert_file" (printf "%s/tls.crt" $dir) }}
{{- $_ := set $t "key_file" (printf "%s/tls.key" $dir) }}
{{- end }}
{{- else if $tls.clientCertificate }}
{{- fail "redis.tls.clientCertificate needs redis.tls.existingSecret: the Secret holding tls.crt and tls.key (and ca.crt)" }}
{{- end }}
{{- if $tls.serverName }}
{{- $_ := set $t "server_name" $tls.serverName }}
{{- end }}
{{- $_ := set $t "verify" (ternary $tls.verify true (hasKey $tls "verify")) }}
{{- $_ := set $redis "tls" $t }}
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
