{{- define "infercost.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "infercost.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "infercost.labels" -}}
{{ include "infercost.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "infercost.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "infercost.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- /* Changes to node.yaml or the price book roll the DaemonSet. */ -}}
{{- define "infercost.configChecksum" -}}
{{- printf "%s\n%s" (include "infercost.nodeConfig" .) (toYaml .Values.prices) | sha256sum -}}
{{- end -}}

{{- define "infercost.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- /* node.yaml as the agent reads it: config, with the pod-resources socket off when not mounted. */ -}}
{{- define "infercost.nodeConfig" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $kube := get $cfg "kubernetes" | default dict -}}
{{- if not .Values.podResources.enabled -}}
{{- $_ := set $kube "pod_resources_socket" nil -}}
{{- end -}}
{{- $_ := set $cfg "kubernetes" $kube -}}
{{- toYaml $cfg -}}
{{- end -}}

{{- /* Whether the state directory is a hostPath (a claim, when given, replaces it). */ -}}
{{- define "infercost.stateOnHost" -}}
{{- if and .Values.stateDir.hostPath (not .Values.stateDir.persistentVolumeClaim) -}}true{{- end -}}
{{- end -}}

{{- /*
  The Pod Security Standards level the rendered pods need (values.yaml, podSecurity): a hostPath
  volume (the state directory or the kubelet socket, for which the agent also runs as uid 0) fails
  baseline, so it needs privileged; without one, every pod of the chart passes restricted.
*/ -}}
{{- define "infercost.podSecurityLevel" -}}
{{- if or .Values.podResources.enabled (include "infercost.stateOnHost" .) -}}privileged{{- else -}}restricted{{- end -}}
{{- end -}}

{{- /* podSecurity: restricted renders nothing that needs more, and says what to change. */ -}}
{{- define "infercost.checkPodSecurity" -}}
{{- if eq .Values.podSecurity "restricted" -}}
{{- $fixes := list -}}
{{- if .Values.podResources.enabled -}}
{{- $fixes = append $fixes "podResources.enabled=false (the kubelet socket is a hostPath and needs uid 0)" -}}
{{- end -}}
{{- if include "infercost.stateOnHost" . -}}
{{- $fixes = append $fixes "stateDir.hostPath=\"\" (an emptyDir) or stateDir.persistentVolumeClaim=<claim>" -}}
{{- end -}}
{{- if $fixes -}}
{{- fail (printf "podSecurity=restricted forbids hostPath volumes: set %s, or install with -f values-restricted.yaml" (join " and " $fixes)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
