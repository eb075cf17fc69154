"""Task multi_vector at export (ColBERT-style late interaction, sentence-transformers' MultiVectorEncoder and the
PyLate checkpoints it reads): what the checkpoint's modules say about each side, the graph ONNX Runtime serves,
the projection the torch engine reads, and the check that the graph gives what the checkpoint's modules give.

MultiVectorEncoder prepares a text by its side. A query: the "query" prompt prepended as text, truncated to the
query length, and with query expansion padded up to the expansion length with [MASK] (or the configured token),
which the encoder attends to only with `attend`, but which are scored either way. A document: the first of the
"document" / "passage" / "corpus" prompts, truncated to the document length, and its skiplist tokens (PyLate's
punctuation) dropped from the vectors. Every token then goes through the Dense projection and, with a Normalize
module, to unit length. serving.json's multi_vector holds what the stages need for that (MultiVectorSpec); a
checkpoint whose modules would do anything else is refused, naming what.
"""

from __future__ import annotations

import json
import string
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from common.contract import PROJECTION_FILE, ServingSpec
from common.multi_vector import DOCUMENT_PROMPTS, MultiVectorSpec
from common.padding import pad_sequences
from export.checkpoint import Checkpoint, CheckpointError
from export.onnx_export import Deviation, onnx_session
from export.tokenizer_training import save_tokenizer

IDENTITY = ("torch.nn.modules.linear.Identity", "torch.nn.Identity")
# A random-init export (settings/variants/colbert.toml): PyLate's defaults.
RANDOM_PROJECTION = 128
RANDOM_EXPANSION = {"strategy": "fixed", "attend": False, "token": None, "length": 32}
RANDOM_PROMPTS = {"query": "[Q] ", "document": "[D] "}


@dataclass(frozen=True)
class Projection:
    weight: np.ndarray  # [dim, hidden] fp32
    bias: np.ndarray | None
    normalize: bool


def _config(folder: Path, module: dict) -> dict:
    path = folder / module["path"] / "config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _refuse_legacy(config: dict) -> None:
    legacy = [key for key in ("query_prefix", "document_prefix", "do_query_expansion") if key in config]
    if config.get("model_type") == "ColBERT" or legacy:
        raise CheckpointError(
            f"a PyLate <= 3 / Stanford ColBERT save ({', '.join(legacy) or 'model_type ColBERT'}) is not served: "
            "load it with sentence_transformers.MultiVectorEncoder and save it again"
        )


def read_multi_vector(
    checkpoint: Checkpoint, hidden: int, max_tokens: int, seed: int = 0
) -> tuple[MultiVectorSpec, Projection]:
    """The checkpoint's MultiVectorEncoder modules (Transformer, Dense, MultiVectorMask, Normalize) as served;
    a random-init source gets PyLate's defaults and a random projection."""
    folder = checkpoint.folder
    if folder is None:
        generator = torch.Generator().manual_seed(seed)
        weight = torch.randn(RANDOM_PROJECTION, hidden, generator=generator) / hidden**0.5
        tokenizer = preset_tokenizer(checkpoint.tokenizer, checkpoint.config.model_type)
        spec = _spec(
            RANDOM_PROMPTS, RANDOM_EXPANSION, {}, list(string.punctuation), ["document"], max_tokens, tokenizer
        )
        return spec, Projection(weight.numpy(), None, True)
    modules_file = folder / "modules.json"
    st_config_file = folder / "config_sentence_transformers.json"
    if not modules_file.is_file() or not st_config_file.is_file():
        raise CheckpointError("task multi_vector needs a MultiVectorEncoder checkpoint (modules.json and its config)")
    st_config = json.loads(st_config_file.read_text())
    _refuse_legacy(st_config)
    if st_config.get("model_type") not in ("MultiVectorEncoder", None):
        raise CheckpointError(
            f"task multi_vector needs a MultiVectorEncoder checkpoint, not a {st_config['model_type']}"
        )
    if st_config.get("similarity_fn_name") not in (None, "maxsim"):
        raise CheckpointError(f"similarity_fn_name {st_config['similarity_fn_name']!r} is not served: maxsim only")
    transformer, dense, mask, normalize = {}, None, None, False
    for module in json.loads(modules_file.read_text()):
        kind, config = module["type"].rsplit(".", 1)[-1], _config(folder, module)
        if kind == "Transformer" and not transformer and dense is None:
            transformer = json.loads((folder / "sentence_bert_config.json").read_text())
        elif kind == "Dense" and dense is None and mask is None:
            if config.get("activation_function") not in IDENTITY:
                raise CheckpointError(f"Dense activation {config.get('activation_function')} is not served: Identity")
            if config.get("module_input_name", "token_embeddings") != "token_embeddings":
                raise CheckpointError("a Dense over anything but the token embeddings is not served")
            dense = (folder / module["path"], config)
        elif kind == "MultiVectorMask" and mask is None and not normalize:
            if config.get("keep_only_token_ids"):
                raise CheckpointError("MultiVectorMask keep_only_token_ids (image patches) is not served")
            mask = config
        elif kind == "Normalize" and not normalize:
            if config.get("module_input_name", "token_embeddings") != "token_embeddings":
                raise CheckpointError("a Normalize over anything but the token embeddings is not served")
            normalize = True
        else:
            raise CheckpointError(f"sentence-transformers module {kind} (at {module['path']!r}) is not served")
    if dense is None or mask is None:
        raise CheckpointError("task multi_vector needs a Dense projection and a MultiVectorMask")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = {name: value for name, value in (st_config.get("prompts") or {}).items() if value}
    spec = _spec(prompts, transformer.get("query_expansion"), transformer, mask.get("skiplist_words") or [],
                 mask.get("skiplist_tasks") or ["document"], max_tokens, tokenizer)  # fmt: skip
    return spec, _projection(*dense, normalize)


def preset_tokenizer(tokenizer: Tokenizer, family: str) -> PreTrainedTokenizerBase:
    """A random-init preset's tokenizer as transformers loads it for the family, so that its [MASK] and punctuation
    ids resolve as MultiVectorEncoder resolves a checkpoint's."""
    with tempfile.TemporaryDirectory() as folder:
        return AutoTokenizer.from_pretrained(save_tokenizer(tokenizer, family, folder))


def _projection(path: Path, config: dict, normalize: bool) -> Projection:
    from safetensors.numpy import load_file

    weights_file = path / "model.safetensors"
    if not weights_file.is_file():
        raise CheckpointError(f"{path} holds no model.safetensors (the Dense projection)")
    weights = load_file(weights_file)
    weight = weights["linear.weight"].astype(np.float32)
    bias = weights["linear.bias"].astype(np.float32) if config.get("bias", True) else None
    return Projection(weight, bias, normalize)


def _spec(prompts: dict, expansion: dict | None, transformer: dict, skiplist: list, skiplist_tasks, max_tokens: int,
          tokenizer) -> MultiVectorSpec:  # fmt: skip
    """MultiVectorSpec as Transformer.preprocess and MultiVectorMask resolve them through the tokenizer."""
    if isinstance(skiplist_tasks, str):
        skiplist_tasks = [skiplist_tasks]
    unknown = set(skiplist_tasks) - {"query", "document"}
    if unknown:
        raise CheckpointError(f"MultiVectorMask skiplist_tasks {sorted(unknown)} are not served: query, document")

    def token_id(token: str) -> int | None:
        found = tokenizer.convert_tokens_to_ids(token)
        return None if found == tokenizer.unk_token_id and token != tokenizer.unk_token else found

    query_length, document_length = transformer.get("query_length"), transformer.get("document_length")
    expansion_id, length, strategy, attended = None, 0, "fixed", False
    query_max = min(query_length or max_tokens, max_tokens)
    if expansion:
        length, strategy, attended = (
            expansion["length"],
            expansion.get("strategy", "fixed"),
            expansion.get("attend", False),
        )
        if expansion.get("token") is not None:
            expansion_id = tokenizer.convert_tokens_to_ids(expansion["token"])
        else:
            expansion_id = tokenizer.mask_token_id if tokenizer.mask_token_id is not None else tokenizer.eos_token_id
        if expansion_id is None:
            raise CheckpointError("query expansion has no token: the tokenizer has no mask nor eos token")
        query_max = length if strategy == "fixed" else max(query_length or max_tokens, length)
        if query_max > max_tokens:
            raise CheckpointError(f"queries take {query_max} tokens, over model.max_tokens {max_tokens}")
    skiplist_ids = tuple(sorted({found for word in skiplist if (found := token_id(word)) is not None}))
    return MultiVectorSpec(
        query_prompt=prompts.get("query") or "",
        document_prompt=next((prompts[name] for name in DOCUMENT_PROMPTS if prompts.get(name)), ""),
        query_max_tokens=query_max,
        document_max_tokens=min(document_length or max_tokens, max_tokens),
        expansion_id=expansion_id,
        expansion_length=length,
        expansion_strategy=strategy,
        expansion_attended=bool(attended),
        skiplist_ids=skiplist_ids,
        skiplist_query="query" in skiplist_tasks,
        skiplist_document="document" in skiplist_tasks,
    )


def save_projection(projection: Projection, out_dir: Path) -> None:
    """The projection for the torch engine (onnxruntime_cpu's graph holds it), and whether it is normalized."""
    arrays = {"weight": projection.weight, "normalize": np.array(projection.normalize)}
    if projection.bias is not None:
        arrays["bias"] = projection.bias
    np.savez(out_dir / PROJECTION_FILE, **arrays)


class MultiVectorStates(nn.Module):
    """What the multi-vector graph serves: ids and mask (the keys each token attends to) in, every token's
    projected, normalized vector out (fp32 [batch, sequence, dim])."""

    def __init__(self, model: PreTrainedModel, projection: Projection) -> None:
        super().__init__()
        self.encoder, self.normalize = model, projection.normalize
        self.linear = nn.Linear(*projection.weight.shape[::-1], bias=projection.bias is not None)
        with torch.no_grad():
            self.linear.weight.copy_(torch.from_numpy(projection.weight))
            if projection.bias is not None:
                self.linear.bias.copy_(torch.from_numpy(projection.bias))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        vectors = self.linear(hidden.float())
        return F.normalize(vectors, p=2, dim=-1) if self.normalize else vectors


def validate_multi_vector(module: MultiVectorStates, onnx_path: Path, sequences: list[np.ndarray],
                          spec: ServingSpec) -> Deviation:  # fmt: skip
    """The graph on one padded batch against the PyTorch module on each sequence alone: every token's vector."""
    ids, mask = pad_sequences(sequences, spec.pad_token_id)
    (served,) = onnx_session(onnx_path).run(None, {"input_ids": ids, "attention_mask": mask})
    with torch.no_grad():
        rows = [module(torch.from_numpy(s[None]), torch.ones((1, len(s)), dtype=torch.int32))[0] for s in sequences]
    served_rows = [served[index, : len(sequence)] for index, sequence in enumerate(sequences)]
    difference = max(float(np.abs(a - b.numpy()).max()) for a, b in zip(served_rows, rows, strict=True))
    return Deviation(difference, max(float(row.abs().max()) for row in rows))
