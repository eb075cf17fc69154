"""What the export reads of a checkpoint saved by the installed sentence-transformers (the pinned release, and the
newest under `make test-compat`): `--explain` says what the export then serves, task by task, and every checkpoint
that cannot be served is refused before anything is written, naming the module, the key and the value, and what
to change. Checkpoints come from the libraries' own save() (tests/checkpoints.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import transformers

from common.contract import ServingSpec
from export.__main__ import export, read
from export.checkpoint import CheckpointError, family_tokenizer
from export.tokenizer_training import save_tokenizer
from settings import ROOT
from tests.checkpoints import (
    MAX_TOKENS,
    TINY,
    VOCABULARY,
    make_checkpoint,
    make_hybrid_checkpoint,
    make_multi_vector_checkpoint,
    make_sparse_checkpoint,
)

pytestmark = pytest.mark.checkpoints
sentence_transformers = pytest.importorskip("sentence_transformers")

PROMPTS = {"query": "query: ", "document": "passage: "}


def exported(tmp_path, source, task: str, **options):
    """(the reading, serving.json) of one source: what --explain prints, and what the export then wrote."""
    reading = read(str(source), task, 0, **options)
    export(str(source), task, 0, tmp_path / "export", 17, 1e-4, onnx=False, **options)
    return reading, ServingSpec.load(tmp_path / "export")


def value(reading, fact: str):
    return reading.facts[fact].value


@pytest.mark.parametrize("pooling", ["mean", "cls", "max", "mean_sqrt_len"])
def test_an_embedder_is_served_as_explained(tmp_path, pooling):
    folder = make_checkpoint(tmp_path / "ck", "bert", "embedding", pooling=pooling, normalize=pooling != "max",
                             prompts=PROMPTS, default_prompt_name="query", max_seq_length=48)  # fmt: skip
    reading, spec = exported(tmp_path, folder, "embedding")
    assert (value(reading, "pooling"), value(reading, "normalize")) == (spec.pooling, spec.normalize)
    assert (spec.pooling, spec.normalize) == (pooling, pooling != "max")
    assert reading.facts["pooling"].source == "1_Pooling/config.json: pooling_mode"
    assert value(reading, "max tokens") == spec.max_tokens == 48
    assert value(reading, "prompts") == spec.prompts == PROMPTS
    assert value(reading, "default prompt") == spec.default_prompt_name == "query"


@pytest.mark.parametrize("task", ["classification", "rerank"])
def test_a_cross_encoder_is_served_as_explained(tmp_path, task):
    reading, spec = exported(tmp_path, make_checkpoint(tmp_path / "ck", "xlm-roberta", task), task)
    assert spec.task == task and value(reading, "max tokens") == spec.max_tokens == 512
    if task == "classification":
        assert tuple(value(reading, "labels")) == spec.labels == ("negative", "neutral", "positive")
    else:
        assert "Sigmoid" in value(reading, "score") and "activation_fn" in reading.facts["score"].source


def test_a_sparse_encoder_is_served_as_explained(tmp_path):
    reading, spec = exported(tmp_path, make_sparse_checkpoint(tmp_path / "ck", activation="log1p_relu"), "sparse")
    assert value(reading, "activation") == spec.activation == "log1p_relu"
    assert (spec.pooling, spec.static_query, spec.max_active_dims) == ("max", False, 0)


def test_a_multi_vector_encoder_is_served_as_explained(tmp_path):
    reading, spec = exported(tmp_path, make_multi_vector_checkpoint(tmp_path / "ck", dim=24), "multi_vector")
    sides = spec.multi_vector
    assert (value(reading, "query prompt"), value(reading, "document prompt")) == ("[unused0] ", "[unused1] ")
    assert (sides["query_prompt"], sides["document_prompt"]) == ("[unused0] ", "[unused1] ")
    assert value(reading, "query tokens") == sides["query_max_tokens"] == 16
    assert value(reading, "document tokens") == sides["document_max_tokens"] == 40
    assert value(reading, "projection") == "64 -> 24" and spec.output_size == 24


def test_a_bge_m3_is_served_as_explained(tmp_path):
    reading, spec = exported(tmp_path, make_hybrid_checkpoint(tmp_path / "ck"), "hybrid")
    assert (value(reading, "pooling"), value(reading, "normalize")) == (spec.pooling, spec.normalize) == ("cls", True)
    assert str(spec.hybrid["colbert_size"]) in value(reading, "colbert vectors")


def test_the_default_model_explains_where_each_fact_was_read():
    run = subprocess.run([sys.executable, "-m", "export", "--explain"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    lines = {line.split()[0]: line for line in run.stdout.splitlines()[1:] if line.strip()}
    assert "1_Pooling/config.json: pooling_mode_mean_tokens" in lines["pooling"]
    assert "256" in lines["max"] and "sentence_bert_config.json: max_seq_length" in lines["max"]
    assert "2_Normalize" in lines["normalize"] and "precision" in lines


def refused(folder, task: str = "embedding", **options) -> str:
    with pytest.raises(CheckpointError) as caught:
        read(str(folder), task, 0, **options)
    return str(caught.value)


def st_modules():
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    return Transformer, Pooling, Dense, Normalize


def test_a_dense_after_the_pooling_is_refused_naming_its_size(tmp_path):
    Transformer, Pooling, Dense, Normalize = st_modules()
    base = make_checkpoint(tmp_path / "base", "bert", "embedding")
    modules = [Transformer(str(base)), Pooling(64, pooling_mode="mean"), Dense(64, 32), Normalize()]
    sentence_transformers.SentenceTransformer(modules=modules, device="cpu").save(str(tmp_path / "ck"))
    message = refused(tmp_path / "ck")
    assert "Dense" in message and "2_Dense" in message and "out_features = 32" in message


@pytest.mark.parametrize("mode", ["weightedmean", "lasttoken", ("mean", "max")])
def test_a_pooling_the_engines_do_not_compute_is_refused_naming_it(tmp_path, mode):
    Transformer, Pooling, _, _ = st_modules()
    base = make_checkpoint(tmp_path / "base", "bert", "embedding")
    modules = [Transformer(str(base)), Pooling(64, pooling_mode=mode)]
    sentence_transformers.SentenceTransformer(modules=modules, device="cpu").save(str(tmp_path / "ck"))
    message = refused(tmp_path / "ck")
    assert "1_Pooling/config.json: pooling_mode" in message
    assert all(name in message for name in ([mode] if isinstance(mode, str) else mode))


def test_a_prompt_left_out_of_the_pooling_is_refused(tmp_path):
    Transformer, Pooling, _, Normalize = st_modules()
    base = make_checkpoint(tmp_path / "base", "bert", "embedding")
    modules = [Transformer(str(base)), Pooling(64, pooling_mode="mean", include_prompt=False), Normalize()]
    model = sentence_transformers.SentenceTransformer(modules=modules, prompts=PROMPTS, device="cpu")
    model.save(str(tmp_path / "ck"))
    assert "1_Pooling/config.json: include_prompt = false with prompts" in refused(tmp_path / "ck")
    model.prompts = {}
    model.save(str(tmp_path / "bare"))
    assert read(str(tmp_path / "bare"), "embedding", 0).facts["include prompt"].value is False, "no prompt to leave"


@pytest.mark.parametrize(
    ("kind", "task", "message"),
    [
        ("rerank", "embedding", 'num_labels = 1: a sequence-classification head; set model.task = "rerank"'),
        ("embedding", "rerank", 'model_type = "SentenceTransformer": set model.task = "embedding"'),
        ("classification", "rerank", 'num_labels = 3: a reranker has one; set model.task = "classification"'),
        ("sparse", "embedding", 'model_type = "SparseEncoder": set model.task = "sparse"'),
        ("multi_vector", "embedding", 'model_type = "MultiVectorEncoder": set model.task = "multi_vector"'),
    ],
)
def test_a_task_the_checkpoint_is_not_is_refused_naming_the_right_one(tmp_path, kind, task, message):
    folder = tmp_path / "ck"
    if kind == "sparse":
        make_sparse_checkpoint(folder)
    elif kind == "multi_vector":
        make_multi_vector_checkpoint(folder)
    else:
        make_checkpoint(folder, "bert", kind)
    assert message in refused(folder, task)


def test_a_bare_checkpoint_is_pooled_as_the_settings_say(tmp_path):
    tokenizer = family_tokenizer("bert", VOCABULARY)
    config = transformers.BertConfig(vocab_size=tokenizer.get_vocab_size(), **TINY["bert"])
    transformers.AutoModel.from_config(config).save_pretrained(tmp_path / "bare")
    save_tokenizer(tokenizer, "bert", tmp_path / "bare", MAX_TOKENS, family_class=False)
    assert 'set model.pooling ("mean", "cls", "max" or "mean_sqrt_len")' in refused(tmp_path / "bare")
    message = "architectures = ['BertModel']: task rerank needs a sequence-classification head"
    assert message in refused(tmp_path / "bare", "rerank")
    reading = read(str(tmp_path / "bare"), "embedding", 0, pooling="cls", normalize=True)
    assert (reading.pooling.mode, reading.pooling.normalize) == ("cls", True)
    assert reading.facts["pooling"].source.startswith("settings: model.pooling")


def test_settings_that_contradict_the_checkpoint_are_refused(tmp_path):
    folder = make_checkpoint(tmp_path / "ck", "bert", "embedding", pooling="cls")
    message = refused(folder, pooling="mean")
    assert 'model.pooling = "mean" but 1_Pooling/config.json: pooling_mode says cls' in message
    assert "model.normalize = False" in refused(folder, normalize=False)


def test_explain_prints_why_a_checkpoint_would_not_be_served(tmp_path):
    folder = make_checkpoint(tmp_path / "ck", "bert", "rerank")
    command = [sys.executable, "-m", "export", "--explain", str(folder)]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 1
    assert "would not be served as task embedding" in run.stdout and 'set model.task = "rerank"' in run.stdout


def test_a_default_prompt_of_a_cross_encoder_is_refused(tmp_path):
    folder = make_checkpoint(tmp_path / "ck", "bert", "rerank")
    model = sentence_transformers.CrossEncoder(str(folder), device="cpu")
    model.prompts, model.default_prompt_name = {"query": "query: "}, "query"
    model.save(str(tmp_path / "prompted"))
    assert "default_prompt_name" in refused(tmp_path / "prompted", "rerank")
