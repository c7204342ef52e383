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

{{/*
The network bits of a CIDR (values.schema.json has checked its syntax):
"4:" or "6:" then the first prefix-length bits of the address, as 0s and 1s.
Two CIDRs overlap when one's result is a prefix of the other's.
*/}}
{{- define "meshd.cidrBits" -}}
{{- $addr := first (splitList "/" .) -}}
{{- $len := atoi (last (splitList "/" .)) -}}
{{- $bits := "" -}}
{{- if contains "." $addr -}}
{{- range splitList "." $addr }}{{ $bits = print $bits (printf "%08b" (atoi .)) }}{{ end -}}
{{- printf "4:%s" (trunc $len $bits) -}}
{{- else -}}
{{- $hex := dict "0" "0000" "1" "0001" "2" "0010" "3" "0011" "4" "0100" "5" "0101" "6" "0110" "7" "0111" "8" "1000" "9" "1001" "a" "1010" "b" "1011" "c" "1100" "d" "1101" "e" "1110" "f" "1111" -}}
{{- $halves := splitList "::" (lower $addr) -}}
{{- $head := list -}}
{{- if first $halves }}{{ $head = splitList ":" (first $halves) }}{{ end -}}
{{- $tail := list -}}
{{- if and (eq (len $halves) 2) (last $halves) }}{{ $tail = splitList ":" (last $halves) }}{{ end -}}
{{- $groups := $head -}}
{{- range until (int (sub 8 (add (len $head) (len $tail)))) }}{{ $groups = append $groups "0" }}{{ end -}}
{{- range concat $groups $tail -}}
{{- range splitList "" (printf "%4s" . | replace " " "0") }}{{ $bits = print $bits (get $hex .) }}{{ end -}}
{{- end -}}
{{- printf "6:%s" (trunc $len $bits) -}}
{{- end -}}
{{- end -}}

{{/*
What meshd refuses and values.schema.json cannot say: two mesh CIDRs of one
family, a service CIDR overlapping a mesh CIDR, a topology label prefix over
253 characters. A failure here is a DaemonSet that crash-loops on every node.
*/}}
{{- define "meshd.checkValues" -}}
{{- $families := dict -}}
{{- range .Values.meshCIDRs -}}
{{- $family := first (splitList ":" (include "meshd.cidrBits" .)) -}}
{{- if hasKey $families $family -}}
{{- fail (printf "meshCIDRs: at most one IPv4 and one IPv6 CIDR (meshd --mesh-cidr), got %s and %s" (get $families $family) .) -}}
{{- end -}}
{{- $_ := set $families $family . -}}
{{- end -}}
{{- range $service := .Values.serviceCIDRs -}}
{{- $s := include "meshd.cidrBits" $service -}}
{{- range $mesh := $.Values.meshCIDRs -}}
{{- $m := include "meshd.cidrBits" $mesh -}}
{{- if or (hasPrefix $m $s) (hasPrefix $s $m) -}}
{{- fail (printf "serviceCIDRs: %s overlaps the mesh CIDR %s (meshCIDRs); meshd refuses a --service-cidr overlapping a --mesh-cidr" $service $mesh) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (contains "/" .Values.topologyLabel) (gt (len (first (splitList "/" .Values.topologyLabel))) 253) -}}
{{- fail (printf "topologyLabel %q: the prefix before / is a DNS subdomain, at most 253 characters" .Values.topologyLabel) -}}
{{- end -}}
{{- end -}}
