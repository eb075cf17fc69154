"""Every encoder family exports for every task, and what the engines serve from the export is what
sentence-transformers and transformers give for the checkpoint: real sentences tokenized with the exported
tokenizer.json, on onnxruntime_cpu and on the torch engine (CPU, fp32).

Each checkpoint is tiny, of random weights, with a tokenizer of the family's real layout (tests/checkpoints.py);
one export per family and task serves every test of it (module-scoped). The references truncate at 512 tokens, as
the exports do: a text longer than that (than every family's positions but ModernBERT's) rides along to show it
is cut, not refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from common.contract import TOKEN_TYPES, ServingSpec
from common.hf_tokenizer import load_tokenizer
from export.__main__ import REPORT_FILE, export
from export.checkpoint import CheckpointError, family_tokenizer
from export.onnx_export import VALIDATION_SENTENCES
from export.tensorrt import check_onnx
from model_repository.stages.engines import load_engine
from model_repository.stages.engines.models import FAMILIES, presets
from tests.checkpoints import LABELS, MAX_TOKENS, MODEL_TYPES, make_checkpoint

transformers = pytest.importorskip("transformers")
sentence_transformers = pytest.importorskip("sentence_transformers")

TASKS = ("embedding", "classification", "rerank")
ENGINES = {"onnxruntime_cpu": {"threads": "2"}, "torch": {"precision": "fp32"}}
LONG_TEXT = " ".join(["Triton batches requests from many clients into one call to the model."] * 80)


@dataclass(frozen=True)
class Exported:
    model_type: str
    task: str
    checkpoint: Path
    export_dir: Path
    expected: np.ndarray  # the reference: embeddings, logits, or CrossEncoder's scores (sigmoid of the logit)


def reference(checkpoint: Path, task: str, texts: list[str], pairs: list[tuple[str, str]]) -> np.ndarray:
    """What sentence-transformers (SentenceTransformer, CrossEncoder) or transformers give for the checkpoint."""
    if task == "embedding":
        return sentence_transformers.SentenceTransformer(str(checkpoint), device="cpu").encode(texts)
    if task == "rerank":
        return sentence_transformers.CrossEncoder(str(checkpoint), device="cpu").predict(pairs)
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        return np.concatenate([model(**tokenizer(text, truncation=True, return_tensors="pt")).logits for text in texts])


def texts_and_pairs() -> tuple[list[str], list[tuple[str, str]]]:
    sentences = VALIDATION_SENTENCES.read_text().splitlines()
    texts = [*sentences, LONG_TEXT]
    return texts, list(zip(texts, [*texts[1:], texts[0]], strict=True))


@pytest.fixture(scope="module", params=[(m, t) for m in MODEL_TYPES for t in TASKS], ids="-".join)
def family_export(request, settings, tmp_path_factory) -> Exported:
    model_type, task = request.param
    folder = tmp_path_factory.mktemp(f"{model_type}-{task}")
    checkpoint = make_checkpoint(folder / "checkpoint", model_type, task)
    engine = settings.engine
    export(str(checkpoint), task, MAX_TOKENS, folder / "export", engine.onnx_opset, engine.onnx_tolerance)
    texts, pairs = texts_and_pairs()
    return Exported(model_type, task, checkpoint, folder / "export", reference(checkpoint, task, texts, pairs))


def test_the_export_is_validated_and_takes_what_the_family_reads(family_export):
    """Within the tolerance, at the outputs' scale; token types only for BERT's pairs; fit for TensorRT's parser."""
    report = json.loads((family_export.export_dir / REPORT_FILE).read_text())
    assert report["model_type"] == family_export.model_type
    assert report["relative_diff_onnxruntime_vs_pytorch"] <= report["tolerance"]
    spec = ServingSpec.load(family_export.export_dir)
    assert spec.token_types == (family_export.model_type == "bert")
    pairs_take_types = family_export.task == "rerank" and family_export.model_type == "bert"
    assert (TOKEN_TYPES in spec.engine_inputs) == pairs_take_types
    graph = onnx.load(str(family_export.export_dir / "model.onnx"), load_external_data=False).graph
    assert [tensor.name for tensor in graph.input] == list(spec.engine_inputs)
    assert check_onnx(family_export.export_dir / "model.onnx", spec.engine_inputs) == []
    if family_export.task == "classification":
        assert spec.labels == LABELS


@pytest.mark.parametrize("kind", ENGINES)
def test_the_engine_serves_what_sentence_transformers_gives(family_export, kind):
    """Embeddings: cosine >= 0.9999; rerank: CrossEncoder's scores within 1e-5, ranked alike; classification:
    transformers' logits within 1e-5. The long text is truncated to the export's max_tokens on both sides."""
    tokenizer = load_tokenizer(family_export.export_dir / "tokenizer.json", MAX_TOKENS)
    texts, pairs = texts_and_pairs()
    encodings = tokenizer.encode_batch(pairs if family_export.task == "rerank" else texts)
    assert max(len(encoding.ids) for encoding in encodings) == MAX_TOKENS, "the long text is cut, not refused"
    ids = [np.array(e.ids, dtype=np.int32) for e in encodings]
    types = [np.array(e.type_ids, dtype=np.int32) for e in encodings] if family_export.task == "rerank" else None
    served = load_engine(kind, family_export.export_dir, "cpu", ENGINES[kind]).forward(ids, types)
    expected = family_export.expected
    if family_export.task == "embedding":
        cosine = (served * expected).sum(1) / np.linalg.norm(served, axis=1) / np.linalg.norm(expected, axis=1)
        assert cosine.min() >= 0.9999, cosine.min()
        np.testing.assert_allclose(served, expected, atol=1e-5, rtol=0)
    elif family_export.task == "rerank":
        scores = 1.0 / (1.0 + np.exp(-served[:, 0].astype(np.float64)))
        np.testing.assert_allclose(scores, expected, atol=1e-5, rtol=0)
        assert list(np.argsort(-scores)) == list(np.argsort(-expected))
    else:
        np.testing.assert_allclose(served, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("model_type", ["gpt2", "deberta-v2"])
def test_an_unsupported_model_type_is_refused_with_the_supported_list(tmp_path, model_type):
    transformers.AutoConfig.for_model(model_type).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=f"{model_type}.*supported: {', '.join(sorted(FAMILIES))}"):
        export(str(tmp_path), "embedding", 128, tmp_path / "export", 17, 1e-4)


def test_max_tokens_over_the_positions_is_refused_naming_both(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "checkpoint", "xlm-roberta", "embedding")
    with pytest.raises(CheckpointError, match=r"max_tokens is 8192, over the 512 tokens"):
        export(str(checkpoint), "embedding", 8192, tmp_path / "export", 17, 1e-4)
    assert not (tmp_path / "export").exists(), "refused before anything is written"


@pytest.mark.parametrize("preset", ["roberta-tiny", "distilbert-tiny", "mpnet-tiny", "modernbert-tiny"])
def test_a_random_init_preset_exports_with_a_tokenizer_of_its_layout(tmp_path, preset):
    """Trained at export from the bundled texts (the same vocabulary on every run), saved beside the model as
    transformers loads it, its padding id in the config and the serving spec."""
    export(f"random-init:{preset}", "rerank", 128, tmp_path, 17, 1e-4)
    fields = presets()[preset]
    retrained = family_tokenizer(fields["model_type"], fields["vocab_size"])
    tokenizer = load_tokenizer(tmp_path / "tokenizer.json", 128)
    tokenizer.no_truncation()
    assert tokenizer.to_str() == retrained.to_str()
    sentence, other = VALIDATION_SENTENCES.read_text().splitlines()[:2]
    ids = tokenizer.encode(sentence, other).ids
    assert transformers.AutoTokenizer.from_pretrained(tmp_path)(sentence, other)["input_ids"] == ids
    pad_token = json.loads((tmp_path / "tokenizer_config.json").read_text())["pad_token"]
    pad_id = json.loads((tmp_path / "config.json").read_text())["pad_token_id"]
    assert tokenizer.token_to_id(pad_token) == pad_id == ServingSpec.load(tmp_path).pad_token_id
