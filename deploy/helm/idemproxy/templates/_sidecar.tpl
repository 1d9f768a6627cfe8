{{/*
The sidecar as a library: the pieces of a pod that runs idemproxy beside an app
container. deployment.yaml builds its pod from them, and a chart of your own that
depends on this one includes them with this chart's context, .Subcharts.idemproxy
(README "The sidecar in your own chart"). Each renders YAML list items (or map
entries), to be placed with nindent:

  idemproxy.sidecar.container        the native sidecar: an item of initContainers
  idemproxy.sidecar.volumes          its volumes: items of volumes
  idemproxy.sidecar.appEnv           IDEMPROXY_ENDPOINT: an item of the app container's env
  idemproxy.sidecar.appVolumeMounts  the socket directory: an item of the app container's volumeMounts
  idemproxy.sidecar.podAnnotations   checksum/config (pods roll when the config changes)
                                     and, with metrics.scrapeAnnotations, prometheus.io/*

The ConfigMap and the Secrets they name are rendered by this chart's own templates.
*/}}

{{- define "idemproxy.sidecar.container" -}}
- name: idemproxy
  image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  restartPolicy: Always
  args: ["-c", "/etc/idemproxy/idemproxy.yaml"]
  ports:
    - name: metrics
      containerPort: {{ .Values.metrics.port }}
      protocol: TCP
  {{- with .Values.startupProbe }}
  startupProbe:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.livenessProbe }}
  livenessProbe:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.readinessProbe }}
  readinessProbe:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: config
      mountPath: /etc/idemproxy
      readOnly: true
    {{- if include "idemproxy.hasPassword" . }}
    - name: redis-password
      mountPath: {{ include "idemproxy.passwordDir" . }}
      readOnly: true
    {{- end }}
    {{- if include "idemproxy.sentinelHasPassword" . }}
    - name: redis-sentinel-password
      mountPath: {{ include "idemproxy.sentinelPasswordDir" . }}
      readOnly: true
    {{- end }}
    {{- if include "idemproxy.tlsSecret" . }}
    - name: redis-tls
      mountPath: {{ include "idemproxy.tlsDir" . }}
      readOnly: true
    {{- end }}
    - name: socket
      mountPath: {{ .Values.socket.dir }}
    {{- with .Values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{- define "idemproxy.sidecar.volumes" -}}
- name: config
  configMap:
    name: {{ include "idemproxy.fullname" . }}
{{- if include "idemproxy.hasPassword" . }}
- name: redis-password
  secret:
    secretName: {{ include "idemproxy.secretName" . }}
    items:
      - key: {{ ternary .Values.redis.existingSecretKey "password" (ne .Values.redis.existingSecret "") }}
        path: password
    defaultMode: 0440
{{- end }}
{{- if include "idemproxy.sentinelHasPassword" . }}
- name: redis-sentinel-password
  secret:
    secretName: {{ include "idemproxy.sentinelSecretName" . }}
    items:
      - key: {{ ternary .Values.redis.sentinel.existingSecretKey "password" (ne .Values.redis.sentinel.existingSecret "") }}
        path: password
    defaultMode: 0440
{{- end }}
{{- if include "idemproxy.tlsSecret" . }}
- name: redis-tls
  secret:
    secretName: {{ .Values.redis.tls.existingSecret }}
    items:
      - key: ca.crt
        path: ca.crt
      {{- if .Values.redis.tls.clientCertificate }}
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
      {{- end }}
    defaultMode: 0440
{{- end }}
- name: socket
  emptyDir:
    sizeLimit: 1Mi
{{- end }}

{{- define "idemproxy.sidecar.appEnv" -}}
- name: IDEMPROXY_ENDPOINT
  value: {{ include "idemproxy.endpoint" . | quote }}
{{- end }}

{{- define "idemproxy.sidecar.appVolumeMounts" -}}
- name: socket
  mountPath: {{ .Values.socket.dir }}
{{- end }}

{{- define "idemproxy.sidecar.podAnnotations" -}}
checksum/config: {{ include "idemproxy.config" . | sha256sum }}
{{- if .Values.metrics.scrapeAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metrics.port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end }}

{{/*
idemproxy.volumeCheck: fails the render when a volumeMount of the worker or of
the sidecar (extraVolumeMounts) names a volume the pod does not have: the API
server would reject the pod.
*/}}
{{- define "idemproxy.volumeCheck" -}}
{{- $names := list }}
{{- range (include "idemproxy.sidecar.volumes" . | fromYamlArray) }}
{{- $names = append $names .name }}
{{- end }}
{{- range .Values.extraVolumes }}
{{- $names = append $names .name }}
{{- end }}
{{- range $what, $mounts := dict "worker.volumeMounts" .Values.worker.volumeMounts "extraVolumeMounts" .Values.extraVolumeMounts }}
{{- range $i, $m := $mounts }}
{{- if not (has $m.name $names) }}
{{- fail (printf "%s[%d] mounts volume %q, which the pod does not have (its volumes: %s): add it to extraVolumes" $what $i $m.name (join ", " $names)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
