"""Quantized embeddings and Cohere's embed on the real tritonserver, called by Cohere's and OpenAI's own SDKs and
raw HTTP: float rows as sentence-transformers computes them; int8/uint8 by one symmetric scale from the model's
calibration, ranking real sentence pairs as the floats do (Spearman >= 0.95 by dot product and by cosine);
int8_calibrated/uint8_calibrated/binary/ubinary the bytes of its quantize_embeddings with the model's calibrated
ranges; and every bad field a 400 naming it while the server keeps serving."""

from __future__ import annotations

import base64

import cohere
import numpy as np
import openai
import pytest
from sentence_transformers.util.quantization import quantize_embeddings

from bench.int8_ranking import pair_similarities, spearman
from loadtest.corpus import load_text
from serving.api.quantization import QUANTIZED, Calibration, symmetric_scale
from tests.server.api_front_process import SENTENCES

DTYPES = {"int8": np.int8, "uint8": np.uint8, "binary": np.int8, "ubinary": np.uint8}
DTYPES |= {"int8_calibrated": np.int8, "uint8_calibrated": np.uint8}
LIBRARY_FORMS = {"int8_calibrated": "int8", "uint8_calibrated": "uint8", "binary": "binary", "ubinary": "ubinary"}
# Served and reference floats come from two engines (ONNX Runtime and PyTorch): a value that close to a bucket's
# edge (or to 0, for the sign, or to a half step, for the symmetric scale) may land on the other side of it.
FLOAT_GAP = 1e-5
MOST_OFF_BY_ONE = 0.005  # share of int8 entries allowed one bucket off, each where FLOAT_GAP explains it
SAME_RANKING = 0.95  # Spearman of the quantized rows' pair similarities against the floats'
ACCEPTED_V2 = ", ".join(("float", "base64", *QUANTIZED))  # what an unknown type's 400 lists


@pytest.fixture(scope="module")
def calibration(exported):
    return Calibration.load(exported)


@pytest.fixture(scope="module")
def ranges(calibration):
    return calibration.ranges(384)


@pytest.fixture(scope="module")
def reference(reference_model):
    return reference_model.encode(SENTENCES, normalize_embeddings=True, convert_to_numpy=True).astype(np.float32)


def symmetric(floats, ranges) -> np.ndarray:
    """int8 as served, written out: round(value * 127 / the calibration's largest |value|), clipped at +-127."""
    return np.clip(np.rint(floats * symmetric_scale(ranges)), -127, 127).astype(np.int8)


def assert_off_by_one_at_edges(served, expected, edge_distance):
    """Entries one bucket off, few, and each where the two engines' floats may straddle an edge."""
    off = served.astype(np.int16) != expected.astype(np.int16)
    assert off.mean() <= MOST_OFF_BY_ONE and (np.abs(served.astype(np.int16) - expected)[off] == 1).all()
    assert (edge_distance[off] < FLOAT_GAP).all(), "an entry differs away from a bucket's edge"


def assert_quantized_as_reference(served, floats, reference, precision, ranges):
    """The served rows are exactly the quantized served floats, and the reference's quantized rows but for entries
    a float rounding boundary explains."""
    served = np.array(served, dtype=DTYPES[precision])
    assert np.abs(floats - reference).max() < FLOAT_GAP
    if precision in ("int8", "uint8"):
        offset = 128 if precision == "uint8" else 0
        assert (served.astype(np.int16) - offset).tobytes() == symmetric(floats, ranges).astype(np.int16).tobytes()
        scale = symmetric_scale(ranges)
        half_steps = np.abs(reference * scale - np.floor(reference * scale) - 0.5) / scale
        expected = symmetric(reference, ranges).astype(np.int16) + offset
        assert_off_by_one_at_edges(served, expected, half_steps)
        return
    library = LIBRARY_FORMS[precision]
    assert served.tobytes() == quantize_embeddings(floats, precision=library, ranges=ranges).tobytes()
    expected = quantize_embeddings(reference, precision=library, ranges=ranges)
    if precision.endswith("binary"):
        flipped = np.unpackbits(served.view(np.uint8), axis=1) != np.unpackbits(expected.view(np.uint8), axis=1)
        assert (np.abs(reference[flipped]) < FLOAT_GAP).all(), "a sign differs away from 0"
        return
    starts = ranges[0].astype(np.float32)
    steps = (ranges[1].astype(np.float32) - starts) / np.float32(255)
    position = (reference - starts) / steps  # a bucket's edge is a whole number
    assert_off_by_one_at_edges(served, expected, np.abs(position - np.round(position)) * steps)


def test_cohere_v2_sdk_embeds_every_type_as_sentence_transformers(front, settings, reference, ranges):
    co = cohere.ClientV2(base_url=front.url, api_key="unused")
    answer = co.embed(
        texts=SENTENCES,
        model=settings.model.name,
        input_type="search_document",
        embedding_types=["float", "base64", *QUANTIZED],
    )
    floats = np.array(answer.embeddings.float_, dtype=np.float32)
    cosines = (floats * reference).sum(1) / np.linalg.norm(floats, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosines.min() >= 0.9999 and answer.texts == SENTENCES
    by_type = answer.embeddings.dict()  # with the types Cohere has not (the _calibrated forms): the SDK's extra fields
    for precision in QUANTIZED:
        rows = by_type[precision]
        assert_quantized_as_reference(rows, floats, reference, precision, ranges)
    assert [len(row) for row in answer.embeddings.binary] == [48] * len(SENTENCES), "384 dimensions in 48 bytes"
    decoded = [np.frombuffer(base64.b64decode(row), dtype="<f4") for row in answer.embeddings.base64]
    assert np.array_equal(np.stack(decoded), floats)
    assert answer.meta.api_version.version == "2" and answer.meta.billed_units.input_tokens > len(SENTENCES)
    # MiniLM has no prompts: a query is embedded as a document is.
    query = co.embed(texts=SENTENCES[:2], model=settings.model.name, input_type="search_query")
    np.testing.assert_allclose(np.array(query.embeddings.float_), floats[:2], atol=1e-6)


def test_cohere_v1_sdk_answers_floats_or_by_type(front, settings, reference, ranges):
    co = cohere.Client(base_url=front.url, api_key="unused")
    plain = co.embed(texts=SENTENCES, model=settings.model.name, input_type="search_document")
    assert plain.response_type == "embeddings_floats" and plain.texts == SENTENCES
    floats = np.array(plain.embeddings, dtype=np.float32)
    assert np.abs(floats - reference).max() < FLOAT_GAP
    typed = co.embed(texts=SENTENCES, model=settings.model.name, input_type="classification", embedding_types=["int8"])
    assert typed.response_type == "embeddings_by_type" and typed.embeddings.float_ is None
    assert_quantized_as_reference(typed.embeddings.int8, floats, reference, "int8", ranges)


def test_openai_sdk_base64_is_unchanged_and_raw_http_gets_the_integer_forms(front, settings, reference, ranges):
    sdk = openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0)
    answer = sdk.embeddings.create(model=settings.model.name, input=SENTENCES, encoding_format="base64")
    floats = np.stack([np.frombuffer(base64.b64decode(item.embedding), dtype="<f4") for item in answer.data])
    assert floats.shape == (len(SENTENCES), 384) and np.abs(floats - reference).max() < FLOAT_GAP
    for precision in ("int8", "int8_calibrated", "binary"):
        body = {"model": settings.model.name, "input": SENTENCES, "encoding_format": precision}
        data = front.post("/v1/embeddings", body).json()
        rows = [item["embedding"] for item in sorted(data["data"], key=lambda item: item["index"])]
        assert all(isinstance(value, int) for value in rows[0]) and data["usage"]["prompt_tokens"] > 0
        assert_quantized_as_reference(rows, floats, reference, precision, ranges)


def test_dimensions_truncate_then_quantize_by_the_calibration_cut_alike(front, settings, calibration):
    body = {"model": settings.model.name, "input": SENTENCES, "dimensions": 64}
    floats = np.array([item["embedding"] for item in front.post("/v1/embeddings", body).json()["data"]], np.float32)
    int8, calibrated = (
        [item["embedding"] for item in front.post("/v1/embeddings", {**body, "encoding_format": kind}).json()["data"]]
        for kind in ("int8", "int8_calibrated")
    )
    cut = calibration.embeddings[:, :64] / np.linalg.norm(calibration.embeddings[:, :64], axis=1, keepdims=True)
    scaled = np.clip(np.rint(floats * np.float32(127 / np.abs(cut).max())), -127, 127)
    assert np.array_equal(np.array(int8), scaled), "the scale of the calibration rows cut and renormalized"
    expected = quantize_embeddings(floats, "int8", calibration_embeddings=cut)
    assert np.array(calibrated, np.int8).tobytes() == expected.tobytes()
    cohere_body = {"texts": SENTENCES, "output_dimension": 64, "embedding_types": ["float", "binary"]}
    answer = front.post("/v2/embed", cohere_body).json()["embeddings"]
    np.testing.assert_allclose(np.array(answer["float"]), floats, atol=1e-6)
    assert np.array(answer["binary"], np.int8).tobytes() == quantize_embeddings(floats, "binary").tobytes()


@pytest.mark.parametrize("dimensions", [None, 64])
def test_int8_and_uint8_rank_real_sentence_pairs_as_the_floats_do(front, settings, sentences, dimensions):
    """The bar a user storing int8 rows relies on: pairs of real texts in the order of their float similarities,
    by dot product and by cosine (uint8 once 128 is taken off). docs/results/cpu-2026-12-04/int8/ has the figures
    at more widths and for the calibrated forms (bench/int8_ranking.py)."""
    corpus = load_text()
    texts = [*sentences, *corpus[:: len(corpus) // 30][:30]]  # 60 texts, 1,770 pairs
    co = cohere.ClientV2(base_url=front.url, api_key="unused")
    answer = co.embed(
        texts=texts,
        model=settings.model.name,
        input_type="search_document",
        embedding_types=["float", "int8", "uint8"],
        output_dimension=dimensions,
    ).embeddings
    floats_dot, floats_cosine = pair_similarities(answer.float_)
    openai_body = {"model": settings.model.name, "input": texts, "encoding_format": "int8"}
    openai_body |= {"dimensions": dimensions} if dimensions else {}
    openai_int8 = [item["embedding"] for item in front.post("/v1/embeddings", openai_body).json()["data"]]
    assert openai_int8 == answer.int8, "the same int8 on OpenAI's route"
    for rows in (np.array(answer.int8), np.array(answer.uint8) - 128):
        dot, cosine = pair_similarities(rows)
        assert spearman(dot, floats_dot) >= SAME_RANKING and spearman(cosine, floats_cosine) >= SAME_RANKING


def test_truncate_start_keeps_the_end_as_tei_left_truncation_does(front):
    text = "alpha beta gamma " * 200 + "and the last words decide"
    start = front.post("/v2/embed", {"texts": [text], "truncate": "START"}).json()["embeddings"]["float"]
    left = front.post("/embed", {"inputs": [text], "truncation_direction": "Left"}).json()
    end = front.post("/v2/embed", {"texts": [text], "truncate": "END"}).json()["embeddings"]["float"]
    np.testing.assert_allclose(start, left, atol=1e-6)
    assert np.abs(np.array(start) - np.array(end)).max() > 1e-3


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        ("/v2/embed", {"texts": ["a"], "embedding_types": ["int4"]}, "embedding_types[0]", f"one of {ACCEPTED_V2}"),
        (
            "/v1/embed",
            {"texts": ["a"], "embedding_types": ["int8-calibrated"]},
            "embedding_types[0]",
            "int8_calibrated",
        ),
        ("/v2/embed", {"texts": ["a"], "embedding_types": "int8"}, "embedding_types", "non-empty list"),
        ("/v1/embed", {"texts": ["a"], "embedding_types": ["base64"]}, "embedding_types[0]", "is not one of"),
        ("/v2/embed", {"texts": ["a"], "input_type": "image"}, "input_type", "must be one of"),
        ("/v2/embed", {"texts": ["a"], "input_type": ["search_query"]}, "input_type", "must be one of"),
        ("/v2/embed", {"texts": ["a"], "truncate": "MIDDLE"}, "truncate", "NONE, START, END"),
        ("/v2/embed", {"texts": ["a"], "truncate": 0}, "truncate", "NONE, START, END"),
        ("/v2/embed", {"texts": ["a", SENTENCES[5]], "truncate": "NONE"}, "texts[1]", "(truncate is NONE)"),
        ("/v2/embed", {"images": ["data:image/png;base64,AA=="]}, "images", "embeds text only"),
        ("/v2/embed", {"inputs": [{"content": []}]}, "inputs", "embeds text only"),
        ("/v2/embed", {"texts": ["a"], "max_tokens": 10}, "max_tokens", "not supported"),
        ("/v2/embed", {"texts": ["a"], "output_dimension": 385}, "output_dimension", "1..384"),
        ("/v2/embed", {"input_type": "search_query"}, "texts", "'texts' is required"),
        ("/v1/embed", {"texts": "a"}, "texts", "non-empty list"),
        ("/v1/embed", {"texts": ["a", 3]}, "texts[1]", "must be a string"),
        ("/v2/embed", {"texts": ["a"], "colour": 1}, "colour", "unknown fields"),
        ("/v2/embed", {"texts": ["a"], "model": "embed-english-v3.0"}, "model", "does not exist"),
        ("/v1/embeddings", {"input": "a", "encoding_format": "int4"}, "encoding_format", f"one of {ACCEPTED_V2}"),
    ],
)
def test_bad_embed_fields_are_named_and_the_server_keeps_serving(front, path, body, param, message):
    answer = front.post(path, body)
    error = answer.json()["error"]
    assert answer.status_code == (404 if param == "model" else 400), answer.text
    assert error["param"] == param and message in error["message"], error
    assert front.post("/v2/embed", {"texts": ["still serving"], "embedding_types": ["int8"]}).status_code == 200
