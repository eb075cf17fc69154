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
from export.checkpoint import CheckpointError
from export.onnx_export import Deviation, onnx_session
from export.reading import INERT, Reading
from export.st_modules import SETTINGS_FILE, TRANSFORMERS, read_modules
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


PYLATE_DENSE = "pylate.models.Dense.Dense"
# Keys only a PyLate (or Stanford ColBERT) save writes at the top of config_sentence_transformers.json.
PYLATE_MARKERS = ("query_length", "document_length", "do_query_expansion", "attend_to_expansion_tokens",
                  "attend_to_mask_tokens", "query_prefix", "document_prefix", "skiplist_words")  # fmt: skip


def _pylate(st_config: dict, transformer: dict) -> tuple[dict, dict, list | None, list[str]]:
    """A PyLate save's prompts, Transformer knobs, skiplist and prefix tokens as MultiVectorEncoder reads them
    (its _parse_model_config): the prefixes ([Q], [D]) go in front of the prompts; query_length and document_length
    are the Transformer's unless its own config says; do_query_expansion (default on) pads queries to query_length
    (default 32); a PyLate <= 3 save (model_type ColBERT) skips punctuation unless it lists its own words."""
    prompts = {name: value for name, value in (st_config.get("prompts") or {}).items() if value}
    prefixes = []
    for key, name in (("query_prefix", "query"), ("document_prefix", "document")):
        if key in st_config:
            prefix = st_config[key] or ""
            prompts[name] = prefix + (prompts.get(name) or "").removeprefix(prefix)
            prefixes.append(prefix)
    knobs = {key: st_config[key] for key in ("query_length", "document_length") if st_config.get(key) is not None}
    if "query_expansion" in st_config:
        knobs["query_expansion"] = st_config["query_expansion"]
    elif any(key in st_config for key in PYLATE_MARKERS):
        if st_config.get("do_query_expansion") is False:
            knobs["query_expansion"] = None
        else:
            attend = st_config.get("attend_to_expansion_tokens", st_config.get("attend_to_mask_tokens"))
            length = knobs.pop("query_length", None) or 32
            knobs["query_expansion"] = {"strategy": "fixed", "attend": bool(attend), "length": length}
    skiplist = st_config.get("skiplist_words")
    if skiplist is None and st_config.get("model_type") == "ColBERT":
        skiplist = list(string.punctuation)
    return prompts, {**knobs, **transformer}, skiplist, prefixes


def read_multi_vector(reading: Reading, seed: int = 0) -> None:
    """The checkpoint's MultiVectorEncoder (or PyLate) modules as served, into the reading: its sides
    (MultiVectorSpec) and its Dense projection. A random-init source gets PyLate's defaults and a random projection.

    Transformer, Dense, then MultiVectorMask and Normalize in either order: both act on each token alone."""
    checkpoint, hidden, max_tokens = reading.checkpoint, reading.checkpoint.config.hidden_size, reading.max_tokens
    saved = read_modules(checkpoint.root)
    if checkpoint.root is None:
        generator = torch.Generator().manual_seed(seed)
        weight = torch.randn(RANDOM_PROJECTION, hidden, generator=generator) / hidden**0.5
        tokenizer = preset_tokenizer(checkpoint.tokenizer, checkpoint.config.model_type)
        reading.sides = _spec(
            RANDOM_PROMPTS, RANDOM_EXPANSION, {}, list(string.punctuation), ["document"], max_tokens, tokenizer
        )
        reading.projection = Projection(weight.numpy(), None, True)
        _facts(reading, "random-init preset: PyLate's defaults")
        return
    if saved is None:
        raise CheckpointError("task multi_vector needs a MultiVectorEncoder or PyLate checkpoint (modules.json)")
    st_config = saved.settings
    if str(st_config.get("similarity_fn_name")).lower() not in ("none", "maxsim", "cosine", "dot"):
        raise CheckpointError(
            f"config_sentence_transformers.json: similarity_fn_name = {st_config['similarity_fn_name']!r}: "
            "MaxSim is served"
        )
    transformer, dense, mask, normalize = None, None, None, False
    for module in saved.modules:
        kind = "Dense" if module.type == PYLATE_DENSE else module.kind
        config = module.config
        if kind in TRANSFORMERS and dense is None and transformer is None:
            transformer = config
        elif kind == "Dense" and dense is None and not normalize:
            if config.get("activation_function") not in IDENTITY:
                key = saved.where(module, "activation_function")
                raise CheckpointError(f"{key} = {config.get('activation_function')!r}: an Identity Dense is served")
            if config.get("module_input_name", "token_embeddings") != "token_embeddings" or config.get("use_residual"):
                raise CheckpointError(
                    f"{saved.where(module)}: a Dense over anything but each token's state is not served"
                )
            dense = (module.folder, config)
        elif kind == "MultiVectorMask" and mask is None:
            if config.get("keep_only_token_ids"):
                raise CheckpointError(f"{saved.where(module, 'keep_only_token_ids')}: image patches are not served")
            mask = config
        elif kind == "Normalize" and dense is not None and not normalize:
            if config.get("module_input_name", "token_embeddings") != "token_embeddings":
                raise CheckpointError(
                    f"{saved.where(module, 'module_input_name')}: a Normalize of anything but each token"
                )
            normalize = True
        elif kind not in INERT:
            raise CheckpointError(f"sentence-transformers module {kind} ({saved.where(module)}) is not served here")
    if dense is None:
        raise CheckpointError("task multi_vector needs a Dense projection after the Transformer")
    tokenizer = AutoTokenizer.from_pretrained(checkpoint.folder)
    prompts, transformer, skiplist, prefixes = _pylate(st_config, transformer or {})
    if mask is None and saved.model_type == "MultiVectorEncoder":
        raise CheckpointError("a MultiVectorEncoder without a MultiVectorMask module is not served")
    if mask is not None:
        skiplist = mask.get("skiplist_words") or []
    elif st_config.get("model_type") == "ColBERT":  # PyLate <= 3 masked and normalized inline
        normalize = True
    reading.prefix_tokens = _prefix_tokens(tokenizer, prefixes)
    reading.sides = _spec(prompts, transformer.get("query_expansion"), transformer, skiplist or [],
                          (mask or {}).get("skiplist_tasks") or ["document"], max_tokens, tokenizer)  # fmt: skip
    reading.projection = _projection(*dense, normalize)
    _facts(reading, f"{saved.model_type or 'PyLate'} modules and {SETTINGS_FILE}")


def _prefix_tokens(tokenizer, prefixes: list[str]) -> list[str]:
    """The PyLate prefixes MultiVectorEncoder registers as special tokens: those the tokenizer knows (whole, or their
    first word) but splits, so that a prefix prepended as text reads as the one token PyLate inserted."""
    added, vocabulary, found = set(tokenizer.added_tokens_encoder), tokenizer.get_vocab(), []
    for value in prefixes:
        if not value or not value.split():
            continue
        for prefix in (value, value.split(None, 1)[0]):
            if prefix not in added and prefix not in vocabulary:
                continue
            if tokenizer.tokenize(prefix) != [prefix]:
                found.append(prefix)
            break
    return found


def _facts(reading: Reading, where: str) -> None:
    sides, projection = reading.sides, reading.projection
    reading.add("query prompt", sides.query_prompt, where)
    reading.add("document prompt", sides.document_prompt, where)
    reading.add("query tokens", sides.query_max_tokens, where)
    reading.add("document tokens", sides.document_max_tokens, where)
    expansion = f"{sides.expansion_strategy} to {sides.expansion_length}" if sides.expansion_id is not None else None
    reading.add("query expansion", expansion, where)
    reading.add("skiplist", f"{len(sides.skiplist_ids)} token ids" if sides.skiplist_ids else None, where)
    reading.add("projection", f"{projection.weight.shape[1]} -> {projection.weight.shape[0]}", where)
    reading.add("normalize", projection.normalize, where)


def preset_tokenizer(tokenizer: Tokenizer, family: str) -> PreTrainedTokenizerBase:
    """A random-init preset's tokenizer as transformers loads it for the family, so that its [MASK] and punctuation
    ids resolve as MultiVectorEncoder resolves a checkpoint's."""
    with tempfile.TemporaryDirectory() as folder:
        return AutoTokenizer.from_pretrained(save_tokenizer(tokenizer, family, folder))


def _projection(path: Path, config: dict, normalize: bool) -> Projection:
    """The Dense's weights, from model.safetensors or (older saves) pytorch_model.bin."""
    from safetensors.numpy import load_file

    if (path / "model.safetensors").is_file():
        weights = load_file(path / "model.safetensors")
    elif (path / "pytorch_model.bin").is_file():
        state = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
        weights = {name: tensor.float().numpy() for name, tensor in state.items()}
    else:
        raise CheckpointError(f"{path} holds no model.safetensors nor pytorch_model.bin (the Dense projection)")
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
