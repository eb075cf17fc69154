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
One settings file, parsed and checked: a dict of what the chart reads from it. The argument: (list TOML WHERE
FIRST), WHERE naming the value in errors, FIRST whether it is settings.toml (whose server-wide sections are the
server's; an extra model's file has none). The file is complete, as helm/sync_settings.py and helm/bundle.py
write it (read over settings/defaults.toml): the chart has no defaults of its own.
*/}}
{{- define "bert-triton.modelShape" -}}
{{- $where := index . 1 }}
{{- $first := index . 2 }}
{{- $raw := fromToml (required (printf "%s must hold a settings file the model repository was generated from" $where) (index . 0)) }}
{{- if hasKey $raw "Error" }}
{{- fail (printf "%s is not valid TOML: %s" $where $raw.Error) }}
{{- end }}
{{- $read := dict "model" (list "task" "name") "engine" (list "kind") "ensemble" (list "topology") "tokenizer" (list "instances") "encoder" (list "instances" "gpus" "warm_first") "postprocess" (list "instances") }}
{{- if $first }}
{{- $_ := set $read "server" (list "http_port" "grpc_port" "metrics_port" "health_port" "exit_timeout_s" "unload_s_per_stub") }}
{{- $_ := set $read "api" (list "port" "workers") }}
{{- $_ := set $read "priority" (list "enabled" "query_instances") }}
{{- else }}
{{- range $section := list "server" "front" "api" "priority" "tenants" "tracing" }}
{{- if hasKey $raw $section }}
{{- fail (printf "%s sets [%s]: the server-wide sections are settings.toml's (helm/sync_settings.py leaves them out)" $where $section) }}
{{- end }}
{{- end }}
{{- end }}
{{- range $section, $keys := $read }}
{{- range $key := $keys }}
{{- if not (hasKey (get $raw $section | default dict) $key) }}
{{- fail (printf "%s lacks [%s] %s: embed the complete file that `python helm/sync_settings.py` or `python helm/bundle.py` writes" $where $section $key) }}
{{- end }}
{{- end }}
{{- end }}
{{- $kind := $raw.engine.kind }}
{{- if eq $kind "torch_gpu" }}{{/* the torch engine's old name, read for one release as the launcher reads it */}}
{{- $kind = "torch" }}
{{- end }}
{{- if and (eq $kind "auto") $raw.encoder.gpus }}{{/* auto on GPUs is torch (common/engine_choice.py); on a CPU
the stage decides, and the image without torch serves onnxruntime_cpu */}}
{{- $kind = "torch" }}
{{- end }}
{{- $gpus := list }}
{{- if has $kind (list "torch" "tensorrt") }}
{{- $gpus = $raw.encoder.gpus }}
{{- end }}
{{/* Python stubs as settings/deployment.py python_stubs counts them: Triton runs an instance group's count on each
GPU it lists; one stage is [encoder]'s (and its query lane's, counted by bert-triton.settings, whose
[priority] is the first model's), two stages [tokenizer]'s, [encoder]'s (unless TensorRT serves it) and a classifier's
[postprocess]. */}}
{{- $topology := $raw.ensemble.topology }}
{{- if eq $topology "auto" }}
{{- $topology = ternary "two_stage" "one_stage" (eq $kind "tensorrt") }}
{{- end }}
{{- $encoder := mul (int $raw.encoder.instances) (max 1 (len $raw.encoder.gpus)) }}
{{- $stubs := $encoder }}
{{- $laneDevices := ternary (max 1 (len $raw.encoder.gpus)) 0 (eq $topology "one_stage") }}
{{- if eq $topology "two_stage" }}
{{- $stubs = int $raw.tokenizer.instances }}
{{- if ne $kind "tensorrt" }}
{{- $stubs = add $stubs $encoder }}
{{- end }}
{{- if eq $raw.model.task "classification" }}
{{- $stubs = add $stubs (int $raw.postprocess.instances) }}
{{- end }}
{{- end }}
{{/* settings/deployment.py rate_limited: the rate limiter honours encoder.warm_first's priorities, which a Python
encoder's instance groups carry (a TensorRT encoder's do not). */}}
{{- $prefersFirst := and $raw.encoder.warm_first (gt (int $raw.encoder.instances) 1) (ne $kind "tensorrt") }}
{{- dict "raw" $raw "engineKind" $kind "gpuIds" $gpus "pythonStubs" $stubs "laneDevices" $laneDevices "prefersFirst" $prefersFirst "lanedGpus" (and (gt (len $gpus) 0) (gt $laneDevices 0)) | toJson }}
{{- end }}

{{/*
The deployment's shape from its settings: settings.toml (the first model, whose [server] and [api] sections
are the server's) and each of extraModels (more models in the same server, one settings file each). GPUs per
pod: the distinct encoder.gpus of every model on a GPU engine; /dev/shm: every model's Python-backend
instances. Returned as JSON: use `fromJson (include "bert-triton.settings" .)`.
*/}}
{{- define "bert-triton.settings" -}}
{{- $first := fromJson (include "bert-triton.modelShape" (list .Values.settings.toml "settings.toml" true)) }}
{{- $raw := $first.raw }}
{{- $server := $raw.server }}
{{- $gpus := $first.gpuIds }}
{{- $stubs := int $first.pythonStubs }}
{{- $lanes := int $first.laneDevices }}
{{- $kinds := list $first.engineKind }}
{{- $names := list $raw.model.name }}
{{- $rateLimited := $first.prefersFirst }}
{{- $lanedGpus := $first.lanedGpus }}
{{- range $index, $extra := .Values.extraModels }}
{{- $shape := fromJson (include "bert-triton.modelShape" (list $extra.toml (printf "extraModels[%d].toml" $index) false)) }}
{{- if eq $shape.engineKind "tensorrt" }}
{{- fail (printf "extraModels[%d]: a TensorRT model is built by the engine build job, which builds the first model's plan only: put it in settings.toml" $index) }}
{{- end }}
{{- if has $shape.raw.model.name $names }}
{{- fail (printf "extraModels[%d]: model.name %q is another model's: each model needs its own" $index $shape.raw.model.name) }}
{{- end }}
{{- $names = append $names $shape.raw.model.name }}
{{- $gpus = concat $gpus $shape.gpuIds }}
{{- $stubs = add $stubs (int $shape.pythonStubs) }}
{{- $lanes = add $lanes (int $shape.laneDevices) }}
{{- $kinds = append $kinds $shape.engineKind }}
{{- $rateLimited = or $rateLimited $shape.prefersFirst }}
{{- $lanedGpus = or $lanedGpus $shape.lanedGpus }}
{{- end }}
{{- if $raw.priority.enabled }}{{/* each one-stage model's query lane: priority.query_instances on each device */}}
{{- $stubs = add $stubs (mul (int $raw.priority.query_instances) $lanes) }}
{{- end }}
{{/* Deployment.takes_gpu_turns: a model on GPUs with a query lane. The launcher's GPU board is then a file in the pod's
/dev/shm (bert-triton.gpuBoard), which the api container reads too. */}}
{{/* Deployment.triton_exit_timeout_s: the drain's bound again, plus unload_s_per_stub for each stub. */}}
{{- $tritonExit := add (int $server.exit_timeout_s) (int (ceil (mulf $server.unload_s_per_stub $stubs))) }}
{{- dict
    "engineKind" $first.engineKind
    "torchImage" (has "torch" $kinds)
    "task" $raw.model.task
    "models" $names
    "served" (ternary $names (list "ensemble") (gt (len $names) 1))
    "gpus" (len (uniq $gpus))
    "pythonStubs" $stubs
    "httpPort" (int $server.http_port)
    "grpcPort" (int $server.grpc_port)
    "metricsPort" (int $server.metrics_port)
    "exitTimeoutS" (int $server.exit_timeout_s)
    "tritonExitTimeoutS" $tritonExit
    "rateLimited" $rateLimited
    "gpuBoard" (and $raw.priority.enabled $lanedGpus)
    "gracePeriodS" (ternary (int .Values.terminationGracePeriodSeconds) (add (int $server.exit_timeout_s) $tritonExit 10) (gt (int .Values.terminationGracePeriodSeconds) 0))
    "healthPort" (int $server.health_port)
    "apiPort" (int $raw.api.port)
    "apiWorkers" (int $raw.api.workers)
    | toJson }}
{{- end }}

{{/*
The GPU board's file (common/gpu_board.py), named to the launcher and the api container alike, so that the API front
sends a query to the lane only while ingestion runs, as it does when the launcher runs it.
*/}}
{{- define "bert-triton.gpuBoard" -}}
/dev/shm/bert-triton-gpu-board
{{- end }}

{{/*
The health check's --model for every served model (the readiness probe checks each: one dead stub fails it).
*/}}
{{- define "bert-triton.modelArgs" -}}
{{- range $model := (fromJson (include "bert-triton.settings" .)).served }}
- --model
- {{ $model }}
{{- end }}
{{- end }}

{{/*
The launcher's and the API front's --settings: the first model's file, then each extra model's.
*/}}
{{- define "bert-triton.settingsArgs" -}}
- --settings
- /etc/bert-triton/settings.toml
{{- range $index, $_ := .Values.extraModels }}
- /etc/bert-triton/model-{{ add $index 1 }}.toml
{{- end }}
{{- end }}

{{/*
Server image: the tag defaults to the chart's appVersion, with "-torch" where a model runs the torch engine (the image
built with --build-arg WITH_TORCH=1).
*/}}
{{- define "bert-triton.image" -}}
{{- $s := fromJson (include "bert-triton.settings" .) }}
{{- $tag := .Values.image.tag }}
{{- if not $tag }}
{{- $tag = .Chart.AppVersion }}
{{- if $s.torchImage }}
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
{{- if le (int $s.gracePeriodS) (add $s.exitTimeoutS $s.tritonExitTimeoutS) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed %d s: the launcher serves until quiet for up to server.exit_timeout_s (%d), then Triton has its exit timeout (%d: as long again, plus server.unload_s_per_stub for each of %d Python stubs); 0 sizes it so" (int $s.gracePeriodS) (int (add $s.exitTimeoutS $s.tritonExitTimeoutS)) (int $s.exitTimeoutS) (int $s.tritonExitTimeoutS) (int $s.pythonStubs)) }}
{{- end }}
{{- if and .Values.tenants.existingSecret (not .Values.apiKey.secret) }}
{{- fail "tenants.existingSecret needs apiKey.secret: the probes' inference sends that key (tenant \"default\")" }}
{{- end }}
{{- if and .Values.tenants.existingSecret (eq .Values.modelRepository.source "objectStore") }}
{{- fail "tenants.existingSecret needs the launcher (modelRepository.source = pvc): its fronts check the tenants" }}
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
{{- printf "%dMi" (max (int .Values.shm.minimumMiB) (mul (int $s.pythonStubs) (int .Values.shm.perInstanceMiB))) }}
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

{{/*
The API key (protocol/api_key.py) from apiKey.secret as BERT_TRITON_API_KEY, for every container that serves or
calls inference: the launcher (Triton's restricted inference group, the HTTP front), the API front, the probes
and the helm test. Renders nothing without a Secret.
*/}}
{{- define "bert-triton.apiKeyEnv" -}}
{{- with .Values.apiKey.secret }}
- name: BERT_TRITON_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.apiKey.secretKey }}
{{- end }}
{{- end }}

{{/*
The chart's tracing values as settings overrides (serving/tracing.py), for the launcher and the API front:
nothing while tracing.endpoint is empty (the embedded settings' [tracing] then holds).
*/}}
{{/*
With tenants.existingSecret: the keys file the Secret mounts, as the settings' tenants.keys_file (serving/tenants.py).
*/}}
{{- define "bert-triton.tenantsArgs" -}}
{{- if .Values.tenants.existingSecret }}
- --set
- tenants.keys_file="/var/run/secrets/bert-triton/tenants/{{ .Values.tenants.secretKey }}"
{{- end }}
{{- end }}

{{- define "bert-triton.tracingArgs" -}}
{{- with .Values.tracing }}
{{- if .endpoint }}
- --set
- tracing.endpoint={{ .endpoint | quote }}
- --set
- tracing.sample_rate={{ .sampleRate }}
- --set
- tracing.service_name={{ .serviceName | quote }}
- --set
- tracing.triton_spans={{ .tritonSpans }}
{{- end }}
{{- end }}
{{- end }}
