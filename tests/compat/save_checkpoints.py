"""Checkpoints saved by the installed library itself, each beside the outputs that library gives for it: run by a
writer environment's Python (make compat-fixtures), with nothing of this repository imported, so that it runs
under sentence-transformers 2.7 to the newest, transformers 4 and 5, PyLate and FlagEmbedding alike.

    python -m tests.compat.save_checkpoints build/compat/tokenizers build/compat/fixtures/st2.7.0

A case is a folder: checkpoint/ as the library's own save wrote it, reference.npz (what the library, loading that
folder again, gives for the texts: encode(), predict(), encode_query() / encode_document()) and fixture.json
(library and versions, family, task, options, and for a checkpoint the export should refuse what the refusal must
name). Each checkpoint starts from a base of random weights of the family's transformers config class (seeded) and
the family's tokenizer.json (tests/compat/base_tokenizers.py) made the era's own tokenizer class; a case the
installed version lacks the class for is listed in skipped.json with why.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
# The export's validation sentences, a few whose case and accents matter (do_lower_case on a cased tokenizer), and
# one longer than every checkpoint's limit (512 tokens; 32 where max_seq_length says so), cut, not refused.
EXTRA = ["TRITON SERVES BERT ON EVERY GPU.", "ÇA DÉMÉNAGE: À BIENTÔT, ÉMILE!", "Über die Straße gehen NAÏVE Cafés."]
LONG = " ".join(["Triton batches requests from many clients into one call to the model."] * 80)
TEXTS = [*(ROOT / "export" / "validation_sentences.txt").read_text().splitlines(), *EXTRA, LONG]
PAIRS = list(zip(TEXTS, [*TEXTS[1:], TEXTS[0]], strict=True))  # each text the query of the next
PROMPTS = {"query": "query: ", "document": "passage: "}
SEED = 0


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    task: str  # the export's task for it
    save: Callable[[Case, Path, Path], dict]  # (case, checkpoint folder, scratch folder) -> the reference arrays
    options: dict = field(default_factory=dict)
    needs: tuple[str, ...] = ()  # "module:Class" or "module:Class(parameter)" the installed library must have
    refused: dict | None = None  # the module, key and value the export's refusal names


def base(family: str, folder: Path, auto: str = "AutoModel", **config) -> str:
    """A transformers checkpoint of the family in folder: the era's tokenizer class around the family's
    tokenizer.json, random tiny weights (a masked-LM's decoder bias lowered so that ~1% of the vocabulary weighs
    something per text, as sparse as a trained SPLADE's); `config` over the tiny config's fields."""
    spec = json.loads((TOKENIZERS / family / "family.json").read_text())
    name = spec["tokenizer_class"]
    tokenizer_class = getattr(transformers, f"{name}Fast", None) or getattr(transformers, name)
    backend = Tokenizer.from_file(str(TOKENIZERS / family / "tokenizer.json"))
    tokenizer = tokenizer_class(tokenizer_object=backend, **spec["tokenizer_kwargs"])
    tokenizer.save_pretrained(str(folder))
    torch.manual_seed(SEED)
    model = getattr(transformers, auto).from_config(
        transformers.AutoConfig.for_model(family, **{**spec["config"], **config})
    )
    if auto == "AutoModelForMaskedLM":
        batch = tokenizer(TEXTS, padding=True, truncation=True, return_tensors="pt")
        with torch.no_grad():
            logits = model.eval()(**batch).logits.masked_fill(batch["attention_mask"][..., None] == 0, -1e9)
            model.get_output_embeddings().bias -= torch.quantile(logits.amax(dim=1).flatten(), 0.99)
    model.save_pretrained(str(folder))
    return str(folder)


def same(saved, loaded, what: str) -> bool:
    """Whether the saved checkpoint, loaded again, gives what the model gave before its save; where it does not (a
    library that loses a setting on its way to disk), the reference is the loaded one's and fixture.json says so."""
    diffs = [np.abs(np.asarray(a) - np.asarray(b)).max() if np.shape(a) == np.shape(b) else np.inf
             for a, b in zip(saved, loaded, strict=True)]  # fmt: skip
    if max(diffs) > 1e-5:
        ROUND_TRIPS[what] = (
            f"loaded again, the saved checkpoint gives other outputs than before its save: {max(diffs):.3g}"
        )
    return max(diffs) <= 1e-5


def packed(prefix: str, rows: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Ragged rows (a text's token vectors) as one array and each text's count."""
    return {f"{prefix}_counts": np.array([len(r) for r in rows]), f"{prefix}_rows": np.concatenate(rows)}


def width(transformer) -> int:
    """The token embeddings' width (6.x renamed the method 5.x and older have)."""
    method = getattr(transformer, "get_embedding_dimension", None) or transformer.get_word_embedding_dimension
    return method()


# --- sentence-transformers ------------------------------------------------------------------------------------
def st_embedder(case: Case, folder: Path, scratch: Path) -> dict:
    from sentence_transformers import SentenceTransformer, models

    o = case.options
    transformer = models.Transformer(
        base(case.family, scratch), max_seq_length=o.get("max_seq_length"), do_lower_case=o.get("do_lower_case", False)
    )
    dim = width(transformer)
    modules = [
        transformer,
        models.Pooling(dim, pooling_mode=o["pooling"], include_prompt=o.get("include_prompt", True)),
    ]
    if o.get("dense"):
        modules.append(models.Dense(dim, 32))
    if o["normalize"]:
        modules.append(models.Normalize())
    prompts = {"prompts": PROMPTS, "default_prompt_name": "query"} if o.get("prompts") else {}
    model = SentenceTransformer(modules=modules, device="cpu", **prompts)
    model.save(str(folder))
    loaded = SentenceTransformer(str(folder), device="cpu")
    reference = {"embeddings": loaded.encode(TEXTS)}
    if o.get("prompts"):  # a named prompt in place of the default one
        reference["prompt_document"] = loaded.encode(TEXTS, prompt_name="document")
    before = model.encode(TEXTS)
    if not same(before, reference["embeddings"], case.name):  # the model as built: the test takes either
        reference["before_save"] = before
    return reference


def spread(model, tokenizer, reach: float = 3.0) -> None:
    """Scale and shift the head's last linear map so that the pairs' logits centre on 0 within +-reach: a fresh
    head scores every pair nearly alike, and a ranking of ties says nothing."""
    batch = tokenizer([q for q, _ in PAIRS], [p for _, p in PAIRS], padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        logits = model.eval()(**batch).logits[:, 0]
        head = [m for name, m in model.named_modules() if name.startswith("classifier")]
        last = [m for m in head if isinstance(m, torch.nn.Linear)][-1]
        scale = reach / (logits - logits.mean()).abs().max()
        last.weight.mul_(scale)
        last.bias.sub_(logits.mean()).mul_(scale)


def st_cross_encoder(case: Case, folder: Path, scratch: Path) -> dict:
    """A CrossEncoder grown from the base as a user fine-tunes one: 1 label (a reranker) or 3 (a classifier)."""
    from sentence_transformers import CrossEncoder

    labels = case.options["num_labels"]
    model = CrossEncoder(base(case.family, scratch), num_labels=labels, device="cpu")
    if labels == 1:
        spread(model.model, model.tokenizer)
    model.save(str(folder))
    loaded = CrossEncoder(str(folder), device="cpu")
    if labels == 1:
        scores = loaded.predict(PAIRS)
        same(model.predict(PAIRS), scores, case.name)
        return {
            "queries": np.array([q for q, _ in PAIRS]),
            "passages": np.array([p for _, p in PAIRS]),
            "scores": scores,
        }
    # A classifier of single texts: the CrossEncoder's own tokenizer and model (predict takes pairs).
    logits = []
    for encoder in (model, loaded):
        batch = encoder.tokenizer(TEXTS, padding=True, truncation=True, return_tensors="pt")
        with torch.no_grad():
            logits.append(encoder.model.eval()(**batch).logits.numpy())
    same(*logits, case.name)
    id2label = loaded.model.config.id2label
    return {"logits": logits[1], "labels": np.array([id2label[i] for i in range(labels)])}


def sparse_dense(encoded) -> np.ndarray:
    """encode_query / encode_document's vectors (sparse tensors) as one dense array [texts, vocabulary]."""
    return encoded.to_dense().numpy() if hasattr(encoded, "to_dense") else np.asarray(encoded)


def st_sparse(case: Case, folder: Path, scratch: Path) -> dict:
    """A SparseEncoder: MLMTransformer (or, in 6.x, Transformer fill-mask) + SpladePooling; with `router`, an
    inference-free one whose queries take SparseStaticEmbedding's weights of their tokens."""
    from sentence_transformers import SparseEncoder, models

    try:  # 5.x's later releases moved them (the old path warns)
        from sentence_transformers.sparse_encoder import modules as sparse_models
    except ImportError:
        from sentence_transformers.sparse_encoder import models as sparse_models

    o = case.options
    path = base(case.family, scratch, "AutoModelForMaskedLM")
    if o.get("fill_mask"):
        mlm = models.Transformer(path, transformer_task="fill-mask")
    else:
        mlm = sparse_models.MLMTransformer(path)
    document = [mlm, sparse_models.SpladePooling(pooling_strategy="max", activation_function=o["activation"])]
    if o.get("router"):
        torch.manual_seed(SEED)
        weight = torch.rand(len(mlm.tokenizer)) * 3
        static = sparse_models.SparseStaticEmbedding(tokenizer=mlm.tokenizer, weight=weight, frozen=False)
        modules = [models.Router.for_query_document(query_modules=[static], document_modules=document)]
    else:
        modules = document
    model = SparseEncoder(modules=modules, device="cpu")
    model.save(str(folder))
    loaded = SparseEncoder(str(folder), device="cpu")
    arrays = {}
    for side in ("query", "document"):
        vectors = sparse_dense(getattr(loaded, f"encode_{side}")(TEXTS))
        same(sparse_dense(getattr(model, f"encode_{side}")(TEXTS)), vectors, case.name)
        texts, indices = np.nonzero(vectors)
        counts = np.bincount(texts, minlength=len(TEXTS))
        arrays |= {f"{side}_indices": indices, f"{side}_rows": vectors[texts, indices], f"{side}_counts": counts}
    return arrays


def st_multi_vector(case: Case, folder: Path, scratch: Path) -> dict:
    """A MultiVectorEncoder as tests/checkpoints.py builds one, its Normalize before or after MultiVectorMask."""
    import string

    from sentence_transformers import MultiVectorEncoder, models
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    expansion = {"strategy": "fixed", "attend": False, "length": 16}
    transformer = models.Transformer(base(case.family, scratch), query_expansion=expansion, document_length=40)
    dim = width(transformer)
    torch.manual_seed(SEED)
    dense = models.Dense(dim, 16, bias=False, module_input_name="token_embeddings", activation_function=None)
    mask = MultiVectorMask(list(string.punctuation))
    normalize = models.Normalize(module_input_name="token_embeddings")
    tail = [normalize, mask] if case.options["normalize_first"] else [mask, normalize]
    prompts = {"query": "[unused0] ", "document": "[unused1] "}
    model = MultiVectorEncoder(modules=[transformer, dense, *tail], prompts=prompts, device="cpu")
    model.save(str(folder))
    loaded = MultiVectorEncoder(str(folder), device="cpu")
    arrays = {}
    for side in ("query", "document"):
        rows = [np.asarray(r) for r in getattr(loaded, f"encode_{side}")(TEXTS, convert_to_numpy=True)]
        same(getattr(model, f"encode_{side}")(TEXTS, convert_to_numpy=True), rows, case.name)
        arrays |= packed(side, rows)
    return arrays


# --- PyLate and FlagEmbedding ---------------------------------------------------------------------------------
def pylate_colbert(case: Case, folder: Path, scratch: Path) -> dict:
    """PyLate's ColBERT grown from the base (its Dense to 16, [Q] / [D] prefixes added to the vocabulary)."""
    from pylate import models

    attend = case.options["attend_to_expansion_tokens"]
    kwargs = {"embedding_size": 16, "query_length": 32, "document_length": 40, "attend_to_expansion_tokens": attend}
    torch.manual_seed(SEED)
    # A ModernBERT's local window as real ones have it, wider than a query: with the tiny one's 16 tokens, a query's
    # last expansion tokens would see no key at all, which transformers and the engines fill differently.
    wide = {"local_attention": 128} if case.family == "modernbert" else {}
    model = models.ColBERT(model_name_or_path=base(case.family, scratch, **wide), device="cpu", **kwargs)
    model.save(str(folder))
    loaded = models.ColBERT(model_name_or_path=str(folder), device="cpu")
    arrays = {}
    for side, is_query in (("query", True), ("document", False)):
        rows = [np.asarray(r) for r in loaded.encode(TEXTS, is_query=is_query, show_progress_bar=False)]
        same(model.encode(TEXTS, is_query=is_query, show_progress_bar=False), rows, case.name)
        arrays |= packed(side, rows)
    return arrays


def flag_modules(*packages: str):
    """FlagEmbedding's modules without its top-level imports (1.4.2's __init__ imports every model, and one needs
    what transformers 5 removed): the packages above them entered as bare namespaces."""
    import sys
    import types

    root = Path(importlib.util.find_spec("FlagEmbedding").origin).parent
    for name in ("FlagEmbedding", *packages):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = module


def flag_m3(case: Case, folder: Path, scratch: Path) -> dict:
    """BGE-M3 as FlagEmbedding's M3 fine-tuning saves it: its runner's get_model (the base, fresh colbert_linear and
    sparse_linear), EncoderOnlyEmbedderM3Model.save, and the tokenizer as its trainer saves it."""
    flag_modules("FlagEmbedding.finetune", "FlagEmbedding.finetune.embedder", "FlagEmbedding.finetune.embedder."
                 "encoder_only", "FlagEmbedding.inference", "FlagEmbedding.inference.embedder")  # fmt: skip
    m3 = importlib.import_module("FlagEmbedding.finetune.embedder.encoder_only.m3")
    inference = importlib.import_module("FlagEmbedding.inference.embedder.encoder_only.m3")
    path = base(case.family, scratch)
    torch.manual_seed(SEED)
    parts = m3.EncoderOnlyEmbedderM3Runner.get_model(path, colbert_dim=case.options["colbert_dim"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    m3.EncoderOnlyEmbedderM3Model(parts, tokenizer=tokenizer, unified_finetuning=True).save(str(folder))
    tokenizer.save_pretrained(str(folder))
    model = inference.M3Embedder(str(folder), use_fp16=False, devices="cpu")
    out = model.encode(TEXTS, max_length=512, return_dense=True, return_sparse=True, return_colbert_vecs=True)
    lexical = [(np.array([int(k) for k in w], dtype=np.int64), np.array(list(w.values()), np.float32)) for w in
               out["lexical_weights"]]  # fmt: skip
    return {
        "dense": np.asarray(out["dense_vecs"]),
        "lexical_indices": np.concatenate([i for i, _ in lexical]),
        **packed("lexical", [v for _, v in lexical]),
        **packed("colbert", [np.asarray(v) for v in out["colbert_vecs"]]),
    }


# --- the cases ------------------------------------------------------------------------------------------------
FAMILIES = ("bert", "roberta", "xlm-roberta", "camembert", "distilbert", "mpnet", "modernbert")
PROMPT_NEED = "sentence_transformers:SentenceTransformer(prompts)"
SPARSE_NEED = "sentence_transformers:SparseEncoder"


def embedder(name: str, family: str, needs: tuple[str, ...] = (), refused: dict | None = None, **options) -> Case:
    return Case(name, family, "embedding", st_embedder, {"pooling": "mean", "normalize": True, **options}, needs,
                refused)  # fmt: skip


def sparse(name: str, family: str, needs: tuple[str, ...] = (), **options) -> Case:
    return Case(name, family, "sparse", st_sparse, {"activation": "relu", **options}, (SPARSE_NEED, *needs))


CASES = {
    "sentence-transformers": [
        *(embedder(f"embed-{family}", family) for family in FAMILIES),
        embedder("pool-cls-xlm-roberta", "xlm-roberta", pooling="cls"),
        embedder("pool-max-bert", "bert", pooling="max", normalize=False),
        embedder("pool-mean_sqrt_len-distilbert", "distilbert", pooling="mean_sqrt_len_tokens", normalize=False),
        embedder("pool-cls-modernbert", "modernbert", pooling="cls", normalize=False),
        embedder("pool-mean-unnormalized-mpnet", "mpnet", normalize=False),
        embedder("dense-bert", "bert", dense=True, refused={"module": "Dense", "key": "out_features", "value": "32"}),
        embedder("max-seq-32-bert", "bert", max_seq_length=32),
        embedder("lowercase-roberta", "roberta", do_lower_case=True),
        embedder("prompts-bert", "bert", (PROMPT_NEED,), prompts=True),
        embedder("no-include-prompt-bert", "bert", include_prompt=False),
        embedder(
            "no-include-prompt-prompts-bert",
            "bert",
            (PROMPT_NEED,),
            include_prompt=False,
            prompts=True,
            refused={"module": "Pooling", "key": "include_prompt", "value": "false"},
        ),
        Case("rerank-bert", "bert", "rerank", st_cross_encoder, {"num_labels": 1}),
        Case("rerank-xlm-roberta", "xlm-roberta", "rerank", st_cross_encoder, {"num_labels": 1}),
        Case("rerank-modernbert", "modernbert", "rerank", st_cross_encoder, {"num_labels": 1}),
        Case("classify-bert", "bert", "classification", st_cross_encoder, {"num_labels": 3}),
        Case("classify-roberta", "roberta", "classification", st_cross_encoder, {"num_labels": 3}),
        sparse("splade-bert", "bert"),
        sparse("splade-log1p-distilbert", "distilbert", activation="log1p_relu"),
        sparse(
            "splade-fill-mask-bert",
            "bert",
            ("sentence_transformers.models:Transformer(transformer_task)",),
            fill_mask=True,
        ),
        sparse("inference-free-bert", "bert", ("sentence_transformers.models:Router",), router=True),
        sparse("inference-free-distilbert", "distilbert", ("sentence_transformers.models:Router",), router=True),
        *(
            Case(
                f"multi-vector-{name}-bert",
                "bert",
                "multi_vector",
                st_multi_vector,
                {"normalize_first": first},
                ("sentence_transformers:MultiVectorEncoder",),
            )
            for name, first in (("mask-normalize", False), ("normalize-mask", True))
        ),
    ],
    "pylate": [
        Case("colbert-bert", "bert", "multi_vector", pylate_colbert, {"attend_to_expansion_tokens": False}),
        Case("colbert-attend-bert", "bert", "multi_vector", pylate_colbert, {"attend_to_expansion_tokens": True}),
        Case("colbert-modernbert", "modernbert", "multi_vector", pylate_colbert, {"attend_to_expansion_tokens": False}),
    ],
    "flagembedding": [Case("bge-m3", "xlm-roberta", "hybrid", flag_m3, {"colbert_dim": -1})],
}
DISTRIBUTIONS = {"sentence-transformers": "sentence-transformers", "pylate": "pylate", "flagembedding": "FlagEmbedding"}


def missing(need: str) -> bool:
    """Whether the installed library lacks what `need` names: 'module:Class' or 'module:Class(parameter)'."""
    import inspect

    module, _, name = need.partition(":")
    name, _, parameter = name.rstrip(")").partition("(")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return True
    return bool(parameter) and parameter not in inspect.signature(found.__init__).parameters


def main() -> None:
    global TOKENIZERS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tokenizers", type=Path, help="base_tokenizers.py's folder")
    parser.add_argument("out", type=Path, help="this writer's fixtures folder (replaced)")
    parser.add_argument("--library", choices=CASES, default="sentence-transformers")
    args = parser.parse_args()
    TOKENIZERS = args.tokenizers
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    from importlib.metadata import version

    library = {"library": args.library, "version": version(DISTRIBUTIONS[args.library])}
    library |= {"transformers": transformers.__version__, "torch": torch.__version__}
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    skipped = {}
    for case in CASES[args.library]:
        lacking = [need for need in case.needs if missing(need)]
        if lacking:
            skipped[case.name] = f"{args.library} {library['version']} has no {', '.join(lacking)}"
            continue
        target = args.out / case.name
        target.mkdir()
        with tempfile.TemporaryDirectory() as scratch:
            reference = case.save(case, target / "checkpoint", Path(scratch))
        np.savez(target / "reference.npz", texts=np.array(TEXTS), **reference)
        fixture = {"writer": args.out.name, **library, "family": case.family, "task": case.task}
        fixture |= {"options": case.options, "refused": case.refused, "round_trip": ROUND_TRIPS.get(case.name)}
        (target / "fixture.json").write_text(json.dumps(fixture, indent=2) + "\n")
        print(f"{args.out.name}/{case.name}", flush=True)
    (args.out / "skipped.json").write_text(json.dumps(skipped, indent=2) + "\n")


TOKENIZERS = Path()
ROUND_TRIPS: dict[str, str] = {}  # case -> how its save does not round-trip
if __name__ == "__main__":
    main()
