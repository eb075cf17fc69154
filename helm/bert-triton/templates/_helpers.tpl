{{/*
Names and labels.
*/}}
{{- define "bert-triton.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "bert-triton.fullname" -}}
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

{{- define "bert-triton.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "bert-triton.selectorLabels" -}}
app.kubernetes.io/name: {{ include "bert-triton.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "bert-triton.labels" -}}
helm.sh/chart: {{ include "bert-triton.chart" . }}
{{ include "bert-triton.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: bert-triton
{{- end }}

{{- define "bert-triton.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "bert-triton.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The settings file (values settings.toml), parsed. The chart reads the deployment's shape from it and has no
defaults of its own: the file is complete, as helm/sync_settings.py and helm/bundle.py write it (the
settings read over settings/defaults.toml). Returned as JSON: use
`fromJson (include "bert-triton.settings" .)`.
*/}}
{{- define "bert-triton.settings" -}}
{{- $raw := fromToml (required "settings.toml must hold the settings file the model repository was generated from" .Values.settings.toml) }}
{{- if hasKey $raw "Error" }}
{{- fail (printf "settings.toml is not valid TOML: %s" $raw.Error) }}
{{- end }}
{{- $read := dict "model" (list "task") "engine" (list "kind") "server" (list "http_port" "grpc_port" "metrics_port" "health_port" "exit_timeout_s") "tokenizer" (list "instances") "encoder" (list "instances" "gpus") "postprocess" (list "instances") "api" (list "port" "workers") }}
{{- range $section, $keys := $read }}
{{- range $key := $keys }}
{{- if not (hasKey (get $raw $section | default dict) $key) }}
{{- fail (printf "settings.toml lacks [%s] %s: embed the complete file that `python helm/sync_settings.py` or `python helm/bundle.py` writes" $section $key) }}
{{- end }}
{{- end }}
{{- end }}
{{- $model := $raw.model }}
{{- $engine := $raw.engine }}
{{- $server := $raw.server }}
{{- $tokenizer := $raw.tokenizer }}
{{- $encoder := $raw.encoder }}
{{- $postprocess := $raw.postprocess }}
{{- $kind := $engine.kind }}
{{- if eq $kind "torch_gpu" }}{{/* the torch engine's old name, read for one release as the launcher reads it */}}
{{- $kind = "torch" }}
{{- end }}
{{- $task := $model.task }}
{{- $gpus := 0 }}
{{- if has $kind (list "torch" "tensorrt") }}
{{- $gpus = len $encoder.gpus }}
{{- end }}
{{- $instances := int $tokenizer.instances }}
{{- if ne $kind "tensorrt" }}
{{- $instances = add $instances (int $encoder.instances) }}
{{- end }}
{{- if eq $task "classification" }}
{{- $instances = add $instances (int $postprocess.instances) }}
{{- end }}
{{- dict
    "engineKind" $kind
    "task" $task
    "gpus" $gpus
    "pythonInstances" $instances
    "httpPort" (int $server.http_port)
    "grpcPort" (int $server.grpc_port)
    "metricsPort" (int $server.metrics_port)
    "exitTimeoutS" (int $server.exit_timeout_s)
    "healthPort" (int $server.health_port)
    "apiPort" (int $raw.api.port)
    "apiWorkers" (int $raw.api.workers)
    | toJson }}
{{- end }}

{{/*
Server image: the tag defaults to the chart's appVersion, with "-torch" for the torch engine (the image
built with --build-arg WITH_TORCH=1).
*/}}
{{- define "bert-triton.image" -}}
{{- $s := fromJson (include "bert-triton.settings" .) }}
{{- $tag := .Values.image.tag }}
{{- if not $tag }}
{{- $tag = .Chart.AppVersion }}
{{- if eq $s.engineKind "torch" }}
{{- $tag = printf "%s-torch" $tag }}
{{- end }}
{{- end }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{- define "bert-triton.builderImage" -}}
{{- printf "%s:%s" .Values.engineBuild.image.repository (default .Chart.AppVersion .Values.engineBuild.image.tag) }}
{{- end }}

{{/*
Checks across values that the schema cannot express.
*/}}
{{- define "bert-triton.validate" -}}
{{- $s := fromJson (include "bert-triton.settings" .) }}
{{- if .Values.engineBuild.enabled }}
{{- if ne $s.engineKind "tensorrt" }}
{{- fail (printf "engineBuild.enabled needs engine.kind = \"tensorrt\" in settings.toml (it is %q)" $s.engineKind) }}
{{- end }}
{{- if ne .Values.modelRepository.source "pvc" }}
{{- fail "engineBuild.enabled needs modelRepository.source = pvc: the plan is assembled into a local copy of the bundle" }}
{{- end }}
{{- end }}
{{- if and (eq .Values.modelRepository.source "objectStore") (not .Values.modelRepository.objectStore.uri) }}
{{- fail "modelRepository.objectStore.uri is required when modelRepository.source = objectStore" }}
{{- end }}
{{- if and .Values.modelRepository.objectStore.gcsCredentialsKey (not .Values.modelRepository.objectStore.credentialsSecret) }}
{{- fail "modelRepository.objectStore.gcsCredentialsKey needs modelRepository.objectStore.credentialsSecret" }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- fail "autoscaling.minReplicas must not exceed autoscaling.maxReplicas" }}
{{- end }}
{{- if and .Values.autoscaling.enabled .Values.autoscaling.gpu.targetAverageUtilization (eq (int $s.gpus) 0) }}
{{- fail (printf "autoscaling.gpu.targetAverageUtilization needs GPUs: engine.kind %q in settings.toml uses none" $s.engineKind) }}
{{- end }}
{{- if le (int .Values.terminationGracePeriodSeconds) (mul 2 $s.exitTimeoutS) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed 2 x server.exit_timeout_s (%d): the launcher serves until quiet for up to exit_timeout_s, then Triton has as long again to exit" (int .Values.terminationGracePeriodSeconds) (mul 2 $s.exitTimeoutS)) }}
{{- end }}
{{- if .Values.apiFront.enabled }}
{{- if eq .Values.modelRepository.source "objectStore" }}
{{- fail "apiFront.enabled needs the model repository on a volume (modelRepository.source = pvc): the front reads its tokenizer and serving.json there, and the launcher's /ready" }}
{{- end }}
{{- if eq (int $s.apiPort) 0 }}
{{- fail "apiFront.enabled needs [api] port > 0 in settings.toml" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Where the server reads the model repository: the object store itself, the assembled copy (engine build), or
the bundle on the claim.
*/}}
{{- define "bert-triton.repository" -}}
{{- if eq .Values.modelRepository.source "objectStore" }}
{{- .Values.modelRepository.objectStore.uri }}
{{- else if .Values.engineBuild.enabled }}
{{- "/models/repository" }}
{{- else }}
{{- "/bundle/repository" }}
{{- end }}
{{- end }}

{{/*
/dev/shm size: shm.sizeLimit, or shm.perInstanceMiB per Python-backend instance (at least shm.minimumMiB).
*/}}
{{- define "bert-triton.shmSize" -}}
{{- if .Values.shm.sizeLimit }}
{{- .Values.shm.sizeLimit }}
{{- else }}
{{- $s := fromJson (include "bert-triton.settings" .) }}
{{- printf "%dMi" (max (int .Values.shm.minimumMiB) (mul (int $s.pythonInstances) (int .Values.shm.perInstanceMiB))) }}
{{- end }}
{{- end }}

{{/*
Resources with the GPUs the settings ask for (requests and limits equal, as extended resources need).
*/}}
{{- define "bert-triton.gpuResources" -}}
{{- $root := index . 0 }}
{{- $resources := deepCopy (default dict (index . 1)) }}
{{- $s := fromJson (include "bert-triton.settings" $root) }}
{{- if gt (int $s.gpus) 0 }}
{{- $name := include "bert-triton.gpuResourceName" $root }}
{{- $_ := set $resources "limits" (merge (dict $name (int $s.gpus)) (default dict $resources.limits)) }}
{{- $_ := set $resources "requests" (merge (dict $name (int $s.gpus)) (default dict $resources.requests)) }}
{{- end }}
{{- toYaml $resources }}
{{- end }}

{{/*
The extended resource a GPU of the settings is: gpu.resourceName, or with MIG's mixed strategy the slice
profile's own resource (nvidia.com/mig-<profile>).
*/}}
{{- define "bert-triton.gpuResourceName" -}}
{{- $mig := .Values.gpu.mig }}
{{- if and (ne $mig.strategy "none") (not $mig.profile) }}
{{- fail "gpu.mig.profile is required when gpu.mig.strategy is single or mixed (e.g. 1g.18gb on H200)" }}
{{- end }}
{{- if eq $mig.strategy "mixed" }}
{{- printf "nvidia.com/mig-%s" $mig.profile }}
{{- else }}
{{- .Values.gpu.resourceName }}
{{- end }}
{{- end }}

{{/*
The GPU product TensorRT plans are cached under (engine cache, GPU_PRODUCT): gpu.product, with the MIG
profile appended when pods run on slices (a plan is tuned for the SMs it sees). Empty without gpu.product.
*/}}
{{- define "bert-triton.gpuProduct" -}}
{{- if .Values.gpu.product }}
{{- if eq .Values.gpu.mig.strategy "none" }}
{{- .Values.gpu.product }}
{{- else }}
{{- printf "%s-MIG-%s" .Values.gpu.product .Values.gpu.mig.profile }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Node selection for GPU pods: values nodeSelector, plus nvidia.com/gpu.product when gpu.product is set (with
MIG's single strategy the sliced product, <product>-MIG-<profile>), plus nvidia.com/mig.strategy with MIG.
*/}}
{{- define "bert-triton.nodeSelector" -}}
{{- $selector := deepCopy (default dict .Values.nodeSelector) }}
{{- $mig := .Values.gpu.mig }}
{{- if .Values.gpu.product }}
{{- $product := .Values.gpu.product }}
{{- if eq $mig.strategy "single" }}
{{- $product = printf "%s-MIG-%s" $product $mig.profile }}
{{- end }}
{{- $_ := set $selector "nvidia.com/gpu.product" $product }}
{{- end }}
{{- if ne $mig.strategy "none" }}
{{- $_ := set $selector "nvidia.com/mig.strategy" $mig.strategy }}
{{- end }}
{{- if $selector }}
{{- toYaml $selector }}
{{- end }}
{{- end }}

{{- define "bert-triton.tolerations" -}}
{{- $s := fromJson (include "bert-triton.settings" .) }}
{{- $tolerations := list }}
{{- if and .Values.gpu.tolerateGpuTaint (gt (int $s.gpus) 0) }}
{{- $tolerations = append $tolerations (dict "key" .Values.gpu.resourceName "operator" "Exists" "effect" "NoSchedule") }}
{{- end }}
{{- $tolerations = concat $tolerations (default list .Values.tolerations) }}
{{- if $tolerations }}
{{- toYaml $tolerations }}
{{- end }}
{{- end }}

{{- define "bert-triton.engineCacheClaim" -}}
{{- default (printf "%s-engine-cache" (include "bert-triton.fullname" .)) .Values.engineBuild.cache.existingClaim }}
{{- end }}

{{/*
The engine-cache command, for the init container and the Job (without --out: cache only).
*/}}
{{- define "bert-triton.engineCacheCommand" -}}
- /opt/nvidia/nvidia_entrypoint.sh
- python3
- /opt/bert-triton/docker/engine_cache.py
- --bundle
- /bundle
- --cache
- /engine-cache
{{- end }}
