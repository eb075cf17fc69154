"""What sentence-transformers' save() writes beyond the pooling changes what a text reads as, and the stage serves
it as encode() computes it: prompts and the default prompt, do_lower_case, max_seq_length, an inference-free
SparseEncoder (a Router: static query weights, MLM documents) with max_active_dims, and a MultiVectorEncoder's
per-token modules in either order. In this process through the stage core (tests/model/stage_run.py), fp32."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.contract import TOKEN_COUNTS, TOKEN_VECTORS_FP32
from export.__main__ import export
from export.onnx_export import VALIDATION_SENTENCES
from protocol.multi_vector import token_vectors
from tests.checkpoints import make_checkpoint, make_multi_vector_checkpoint, make_sparse_checkpoint
from tests.model.stage_run import refusal, served, stage

pytestmark = pytest.mark.checkpoints
sentence_transformers = pytest.importorskip("sentence_transformers")

PROMPTS = {"query": "query: ", "document": "passage: "}
# Upper case and accents, so that lowercasing changes a case-sensitive tokenizer's ids.
MIXED = ["Triton Batches Requests FROM Many Clients.", "Élan vital et CAFÉ crème", "GPU kernels run FAST"]
LONG = " ".join(["Triton batches requests from many clients into one call to the model."] * 20)


def sentences() -> list[str]:
    return VALIDATION_SENTENCES.read_text().splitlines()[:12]


def served_core(tmp_path, folder, task: str = "embedding"):
    export(str(folder), task, 0, tmp_path / "export", 17, 1e-4, onnx=False)
    return stage(tmp_path / "export", "torch")


def close(got: np.ndarray, want: np.ndarray) -> None:
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= 0.9999, cosine.min()
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_the_default_prompt_and_a_named_one_are_read_as_encode_reads_them(tmp_path):
    folder = make_checkpoint(tmp_path / "ck", "bert", "embedding", prompts=PROMPTS, default_prompt_name="query")
    core, texts = served_core(tmp_path, folder), sentences()
    model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    close(served(core, texts)["embedding"], model.encode(texts))
    close(served(core, texts, {"prompt_name": "document"})["embedding"], model.encode(texts, prompt_name="document"))
    close(served(core, texts, {"prompt_name": ""})["embedding"], model.encode(texts, prompt=""))
    assert not np.allclose(served(core, texts)["embedding"], served(core, texts, {"prompt_name": ""})["embedding"])
    assert "'summary' is not one of the model's prompts (document, query)" in refusal(
        core, texts, {"prompt_name": "summary"}
    )


def test_do_lower_case_reads_a_case_sensitive_tokenizer_lowercased(tmp_path):
    folder = make_checkpoint(tmp_path / "ck", "roberta", "embedding", do_lower_case=True)
    core = served_core(tmp_path, folder)
    model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    close(served(core, MIXED)["embedding"], model.encode(MIXED))
    lowered = served(core, [text.lower() for text in MIXED])
    np.testing.assert_array_equal(served(core, MIXED)["tokens"], lowered["tokens"])
    np.testing.assert_allclose(served(core, MIXED)["embedding"], lowered["embedding"], atol=1e-6)


def test_max_seq_length_is_where_a_text_is_cut(tmp_path):
    folder = make_checkpoint(tmp_path / "ck", "xlm-roberta", "embedding", max_seq_length=24)
    core = served_core(tmp_path, folder)
    model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    answer = served(core, [LONG, "short"])
    assert answer["tokens"].reshape(-1)[0] == 24
    close(answer["embedding"], model.encode([LONG, "short"]))


def static_sparse_checkpoint(folder, max_active_dims: int):
    """An inference-free SparseEncoder, as its documentation builds one: a Router of SparseStaticEmbedding (the
    query side: a weight per vocabulary id) and Transformer(fill-mask) + SpladePooling (documents)."""
    from sentence_transformers.base.modules import Router, Transformer
    from sentence_transformers.sparse_encoder.modules import SparseStaticEmbedding, SpladePooling
    from transformers import AutoTokenizer

    mlm = make_sparse_checkpoint(folder.parent / "mlm", nonzero=0.05)
    tokenizer = AutoTokenizer.from_pretrained(mlm)
    weight = torch.rand(len(tokenizer.get_vocab()), generator=torch.Generator().manual_seed(0))
    weight[torch.rand(weight.shape, generator=torch.Generator().manual_seed(1)) < 0.3] = 0
    router = Router.for_query_document(
        query_modules=[SparseStaticEmbedding(tokenizer=tokenizer, weight=weight, frozen=True)],
        document_modules=[Transformer(str(mlm), transformer_task="fill-mask"), SpladePooling("max")],
    )
    model = sentence_transformers.SparseEncoder(modules=[router], max_active_dims=max_active_dims, device="cpu")
    model.save(str(folder))
    return model


def dense_rows(answer: dict, width: int) -> np.ndarray:
    rows = np.zeros((len(answer["sparse_indices"]), width), dtype=np.float32)
    for row, indices, values in zip(rows, answer["sparse_indices"], answer["sparse_values"], strict=True):
        row[indices[indices >= 0]] = values[indices >= 0]
    return rows


def test_an_inference_free_sparse_encoder_serves_both_sides_as_encode_does(tmp_path):
    model = static_sparse_checkpoint(tmp_path / "ck", max_active_dims=24)
    core, texts = served_core(tmp_path, tmp_path / "ck", "sparse"), [*sentences(), *MIXED]
    width = model.get_embedding_dimension()
    for side, encode in (("query", model.encode_query), ("document", model.encode_document)):
        want = encode(texts, convert_to_tensor=True).to_dense().numpy()
        got = dense_rows(served(core, texts, {"input_type": side}), width)
        np.testing.assert_array_equal(got > 0, want > 0)
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert ((want > 0).sum(1) == 24).all(), "documents keep max_active_dims entries"
    default = dense_rows(served(core, texts), width)
    np.testing.assert_allclose(default, want, atol=1e-4, rtol=0, err_msg="a text of no side is a document")


@pytest.mark.parametrize("order", ["mask-then-normalize", "normalize-then-mask"])
def test_a_multi_vector_encoders_per_token_modules_serve_in_either_order(tmp_path, order):
    folder = make_multi_vector_checkpoint(tmp_path / "ck", normalize_last=order == "mask-then-normalize")
    core, texts = served_core(tmp_path, folder, "multi_vector"), sentences()
    model = sentence_transformers.MultiVectorEncoder(str(folder), device="cpu")
    for side, encode in (("query", model.encode_query), ("document", model.encode_document)):
        answer = served(core, texts, {"input_type": side}, asked=(TOKEN_VECTORS_FP32, TOKEN_COUNTS))
        for got, want in zip(token_vectors(answer), encode(texts), strict=True):
            want = np.asarray(want)
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
