{{/*
Names. Kubernetes names are capped at 63 characters; vLLM server names get "-vllm-<server>" appended,
so the base name is capped lower to leave room for the longest server key (32 chars by schema).
*/}}
{{- define "lemon.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lemon.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 25 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 25 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 25 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "lemon.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object: baseLabels plus name/instance. */}}
{{- define "lemon.labels" -}}
app.kubernetes.io/name: {{ include "lemon.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{ include "lemon.baseLabels" . }}
{{- end }}

{{/* The labels that are never part of a selector; pod templates add their selector labels to these. */}}
{{- define "lemon.baseLabels" -}}
helm.sh/chart: {{ include "lemon.chart" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: lemon
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector of the lemon service pods (component "server"; vLLM pods never match it). */}}
{{- define "lemon.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lemon.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end }}

{{/* Selector of one vLLM server's pods. Call with (dict "root" $ "server" $name). */}}
{{- define "lemon.vllmSelectorLabels" -}}
app.kubernetes.io/name: {{ include "lemon.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: vllm
lemon.dev/vllm-server: {{ .server }}
{{- end }}

{{- define "lemon.vllmName" -}}
{{- printf "%s-vllm-%s" (include "lemon.fullname" .root) .server }}
{{- end }}

{{/* OpenAI base URL of an in-chart vLLM server. */}}
{{- define "lemon.vllmUrl" -}}
{{- printf "http://%s:%v/v1" (include "lemon.vllmName" .) .root.Values.vllm.port }}
{{- end }}

{{- define "lemon.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "lemon.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag or repository@digest. Call with (dict "image" $img "default" $tag). */}}
{{- define "lemon.imageRef" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .default .image.tag) }}
{{- end }}
{{- end }}

{{/* S3 settings as container env (endpoint, region, credentials from the referenced Secret). */}}
{{- define "lemon.s3Env" -}}
{{- with .Values.s3.endpointUrl }}
- name: LEMON_S3_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.s3.region }}
- name: AWS_DEFAULT_REGION
  value: {{ . | quote }}
{{- end }}
{{- if .Values.s3.existingSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .Values.s3.existingSecret }}
      key: {{ .Values.s3.accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.s3.existingSecret }}
      key: {{ .Values.s3.secretAccessKeyKey }}
{{- end }}
{{- end }}

{{/*
The pool file. An `openai` level without base_url is pointed at the in-chart vLLM server of the same
name. Levels are copied, never mutated, so repeated renders see the user's values unchanged.
*/}}
{{- define "lemon.poolYaml" -}}
{{- $levels := list }}
{{- range .Values.pool.levels }}
{{- $level := deepCopy . }}
{{- if and (eq .backend "openai") (not .base_url) }}
{{- $_ := set $level "base_url" (include "lemon.vllmUrl" (dict "root" $ "server" .name)) }}
{{- end }}
{{- $levels = append $levels $level }}
{{- end }}
{{- $pool := dict "levels" $levels }}
{{- with .Values.pool.description }}
{{- $_ := set $pool "description" . }}
{{- end }}
{{- toYaml $pool }}
{{- end }}

{{/*
Cross-field checks the JSON schema cannot express; each failure names the values to change.
*/}}
{{- define "lemon.validate" -}}
{{- $servers := .Values.vllm.servers }}
{{- $seen := dict }}
{{- range .Values.pool.levels }}
{{- if hasKey $seen .name }}
{{- fail (printf "pool.levels: level name %q appears twice; every capacity level needs a unique name" .name) }}
{{- end }}
{{- $_ := set $seen .name true }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- fail (printf "autoscaling.minReplicas (%v) is above autoscaling.maxReplicas (%v): lower min or raise max" .Values.autoscaling.minReplicas .Values.autoscaling.maxReplicas) }}
{{- end }}
{{- $grace := int .Values.serve.terminationGracePeriodSeconds }}
{{- if gt (add (int .Values.serve.shutdownGraceSeconds) 3) $grace }}
{{- fail (printf "serve.shutdownGraceSeconds (%v) must be at least 3 below serve.terminationGracePeriodSeconds (%v), or the kubelet kills the pod before it has drained: lower the first or raise the second" .Values.serve.shutdownGraceSeconds .Values.serve.terminationGracePeriodSeconds) }}
{{- end }}
{{- range .Values.pool.levels }}
{{- if and (eq .backend "openai") (not .base_url) }}
{{- $server := get $servers .name }}
{{- if and $server $server.enabled (ne $server.servedModelName .model) }}
{{- fail (printf "pool level %q has model %q but vllm.servers.%s.servedModelName is %q: set them to the same name (the pool sends it as the OpenAI `model`)" .name .model .name $server.servedModelName) }}
{{- end }}
{{- end }}
{{- end }}
{{- range $name, $server := $servers }}
{{- if $server.enabled }}
{{- if and (eq $server.source "s3") (not $server.s3Uri) }}
{{- fail (printf "vllm.servers.%s.source is s3 but s3Uri is empty: set vllm.servers.%s.s3Uri=s3://bucket/prefix/" $name $name) }}
{{- end }}
{{- if and (eq $server.source "pvc") (not (and $server.pvc $server.pvc.claimName)) }}
{{- fail (printf "vllm.servers.%s.source is pvc but pvc.claimName is empty: set vllm.servers.%s.pvc.claimName" $name $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and .Values.podDisruptionBudget.enabled (hasKey .Values.podDisruptionBudget "minAvailable") (hasKey .Values.podDisruptionBudget "maxUnavailable") }}
{{- fail "podDisruptionBudget: set either minAvailable or maxUnavailable, not both" }}
{{- end }}
{{- end }}
