{{/* Name of every object. */}}
{{- define "meshd.fullname" -}}
{{- default "meshd" .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "meshd.labels" -}}
app.kubernetes.io/name: meshd
app.kubernetes.io/part-of: meshd
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "meshd.selectorLabels" -}}
app.kubernetes.io/name: meshd
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node-agent
{{- end -}}

{{- define "meshd.mirrorSelectorLabels" -}}
app.kubernetes.io/name: meshd
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: mirror
{{- end -}}

{{- define "meshd.linkSelectorLabels" -}}
app.kubernetes.io/name: meshd
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: link
{{- end -}}

{{- define "meshd.mcsDNSSelectorLabels" -}}
app.kubernetes.io/name: meshd
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: mcs-dns
{{- end -}}

{{- define "meshd.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}

{{/* UAPI socket of the sidecar's device. */}}
{{- define "meshd.uapiSocket" -}}
/var/run/wireguard/{{ .Values.interface }}.sock
{{- end -}}
