"""What export, the generated repository, the stages and the clients agree on: file and tensor names, and
the model's serving spec (serving.json, written by export and read by every engine)."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

TEXT_INPUT = "text"  # the ensemble's TYPE_STRING input (a reranker's: the passage)
QUERY_INPUT = "query"  # a reranker's second TYPE_STRING input: the query each row's text is scored against
TOKENS_OUTPUT = "tokens"  # int32 [1] per text: the tokens the model saw ([CLS] and [SEP] included, after truncation)
SCORE_OUTPUT = "score"  # fp32 [1] per (query, text) pair: a reranker's logit, before any sigmoid
ENGINE_INPUTS = ("input_ids", "attention_mask")  # int32 [batch, sequence]: ONNX, TensorRT, the two-stage hop
TOKEN_TYPES = "token_type_ids"  # int32 [batch, sequence], a third engine input for BERT pairs: 0 query, 1 text
QUERY_LANE_SUFFIX = "-query"  # <model>-query: a model's query lane, the same stage for queries only ([priority])
LANE_PARAMETER = "lane"  # KServe parameter: "query" names a request to the model itself a query (not ingestion)
DEADLINE_PARAMETER = "deadline_ns"  # int: a request is refused unrun past this time.monotonic_ns() (the host's
# CLOCK_MONOTONIC, one clock for every process of the host): the API front's budget, as the stage sees it
BUDGET_EXPIRED = "time budget ran out"  # the refusal's words, which the fronts read as a timeout
WARMUP_TEXT = "Warm-up request: the first real request should not pay for lazy initialization."
SERVING_FILE = "serving.json"
CALIBRATION_FILE = "calibration.npy"  # an embedder's unit embeddings of its calibration corpus (export/calibration.py)
OPTION_PREFIX = "engine."  # config parameters that carry the settings' [engine] options
# The files of an engine process (stages/engines/shared.py) in the temporary folder:
# ENGINE_PROCESS_PREFIX<tritonserver pid>-<model key>.sock, .ready (its pid), .lock, .log; the launcher removes a dead
# server's.
ENGINE_PROCESS_PREFIX = "bert-triton-engine-"
# A sparse model's outputs, per request [texts, that request's most non-zero entries]: each text's vocabulary
# indices (int32, ascending, padded with -1) and their weights (fp32, padded with 0).
SPARSE_INDICES = "sparse_indices"
SPARSE_VALUES = "sparse_values"
SPARSE_PADDING = {SPARSE_INDICES: -1, SPARSE_VALUES: 0.0}
# KServe request parameters (and config parameters: the settings' [sparse] defaults) that cut a sparse answer.
SPARSE_TOP_K = "sparse_top_k"  # int: keep a text's k largest entries; 0: all
SPARSE_THRESHOLD = "sparse_threshold"  # float: keep entries above it; 0: every non-zero one
SPARSE_HEAD_FILE = "sparse_head.npz"  # the MLM decoder (weight [vocab, hidden], bias) for onnxruntime_cpu
# An inference-free sparse model's query side (SparseStaticEmbedding): a weight per vocabulary id, float32 [vocab];
# a query (input_type query) is each of its distinct tokens' weight, without the engine.
STATIC_QUERY_FILE = "query_weights.npy"
# A multi-vector model's outputs, per request: its texts' kept token vectors, unit length, packed one text after
# another ([the request's kept tokens, dim]: no padding), and how many each text kept (int32 [texts, 1]). The
# vectors come as fp16 (token_vectors) or, to a request that asks for token_vectors_fp32 and not token_vectors,
# as fp32; a request that names no outputs gets fp16.
TOKEN_VECTORS = "token_vectors"
TOKEN_VECTORS_FP32 = "token_vectors_fp32"
TOKEN_COUNTS = "token_counts"
# Late chunking of an embedder: the KServe request parameter chunk_tokens (int >= 1) has each text read in one pass
# and its own tokens mean-pooled per chunk of that many; the answer per request: chunk_embeddings fp32 packed
# [the request's chunks, dim] and chunk_counts int32 [texts, 1].
CHUNK_TOKENS = "chunk_tokens"
CHUNK_EMBEDDINGS = "chunk_embeddings"
CHUNK_COUNTS = "chunk_counts"
# KServe request parameter: the sentence-transformers prompt (by name) put before each text; "" for none; a request
# without it is read with the model's default prompt, if it has one (model_repository/stages/prompts.py).
PROMPT_PARAMETER = "prompt_name"
INPUT_TYPE = "input_type"  # KServe request parameter of a multi-vector model: query | document (the default)
INPUT_TYPES = ("query", "document")
# Packed outputs (rows of all of a request's texts, one text after another) and the output of each text's count.
PACKED_OUTPUTS = {TOKEN_VECTORS: TOKEN_COUNTS, TOKEN_VECTORS_FP32: TOKEN_COUNTS, CHUNK_EMBEDDINGS: CHUNK_COUNTS}
PROJECTION_FILE = "projection.npz"  # a multi-vector model's Dense (weight [dim, hidden], bias if any), for torch
# A hybrid model's (BGE-M3's) graph outputs, from one pass: each text's dense vector, each token's lexical weight
# (ReLU of the sparse head) and each token's colbert vector; the stage answers the dense, sparse and multi-vector
# outputs from them, each request those it asks for.
TOKEN_WEIGHTS = "token_weights"
HYBRID_GRAPH_OUTPUTS = ("embedding", TOKEN_WEIGHTS, TOKEN_VECTORS)
HYBRID_HEADS_FILE = "hybrid_heads.npz"  # BGE-M3's sparse_linear and colbert_linear (weights, biases), for torch


@dataclass(frozen=True)
class ServingSpec:
    """What `export` recorded about the model: task, pooling and output layout."""

    task: str  # embedding | classification | rerank | sparse | multi_vector | hybrid (dense, sparse and multi-vector)
    pooling: str  # mean | cls | max | mean_sqrt_len (embedding only; sparse: max, SpladePooling's strategy)
    normalize: bool  # L2-normalize pooled embeddings
    hidden_size: int
    # embedding width (hybrid: its dense vector's), number of labels, (sparse) the vocabulary, (multi_vector) the
    # projection
    output_size: int
    labels: tuple[str, ...]  # classification labels by class index
    max_tokens: int
    pad_token_id: int
    # Whether the model reads a pair's token types (BERT's segments; RoBERTa's family and the others send none):
    # the engine then takes them as a third input. True for a serving.json older than the field: BERT's.
    token_types: bool = True
    # sparse: SpladePooling's activation_function, relu (log1p(relu(x))) or log1p_relu (log1p applied twice).
    activation: str = "relu"
    # multi_vector: how MultiVectorEncoder prepares each side (export/multi_vector_export.py MultiVectorSpec's fields).
    multi_vector: dict | None = None
    # hybrid: colbert_size (its token vectors' width) and unused_ids (the tokens without a lexical weight: BGE-M3's
    # cls, eos, pad and unk); its multi_vector is both sides alike, every token but the first keeping a vector.
    hybrid: dict | None = None
    # sentence-transformers' prompts by name, and the one put before a text that names none (default_prompt_name):
    # the stage prepends it unless a request's prompt_name parameter names another ("" none).
    prompts: dict | None = None
    default_prompt_name: str | None = None
    # sparse: a SparseEncoder's max_active_dims (each vector's largest entries kept; 0 all), and whether its query
    # side is static (STATIC_QUERY_FILE).
    max_active_dims: int = 0
    static_query: bool = False

    @classmethod
    def load(cls, model_dir: Path) -> ServingSpec:
        raw = json.loads((Path(model_dir) / SERVING_FILE).read_text())
        return cls(**{**raw, "labels": tuple(raw["labels"])})

    def save(self, model_dir: Path) -> None:
        data = {**self.__dict__, "labels": list(self.labels)}
        (Path(model_dir) / SERVING_FILE).write_text(json.dumps(data, indent=2) + "\n")

    @property
    def output_name(self) -> str:
        # A sparse model's graph gives each token's MLM-transformed state; the engine projects and pools it.
        # A multi-vector graph gives every token's projected (and normalized) vector.
        names = {"embedding": "embedding", "sparse": "token_states", "multi_vector": "token_vectors"}
        return names.get(self.task, "logits")

    @property
    def graph_outputs(self) -> tuple[str, ...]:
        """What the exported graph answers: a hybrid model's three, one output for the others."""
        return HYBRID_GRAPH_OUTPUTS if self.task == "hybrid" else (self.output_name,)

    @property
    def pairs(self) -> bool:
        """Whether a row is a (query, text) pair: token types in, one logit out (a cross-encoder)."""
        return self.task == "rerank"

    @property
    def engine_inputs(self) -> tuple[str, ...]:
        """What the engine takes: ids and mask, and for pairs of a model that reads them the token types."""
        return (*ENGINE_INPUTS, TOKEN_TYPES) if self.pairs and self.token_types else ENGINE_INPUTS


def engine_process_files(server_pid: int, suffix: str = "") -> list[Path]:
    """The files of tritonserver `server_pid`'s engine processes, all of them or those ending in `suffix`."""
    return sorted(Path(tempfile.gettempdir()).glob(f"{ENGINE_PROCESS_PREFIX}{server_pid}-*{suffix}"))
