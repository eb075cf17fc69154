"""The keys file's validation, the token buckets' arithmetic, their sharing across processes, and reloading
(serving/tenants.py, serving/tenant_limits.py)."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from serving.tenant_limits import SharedBuckets, refill, retry_after, take
from serving.tenants import ENV_TENANT, KeysError, Tenants, parse_keys
from settings import load_deployment

GOOD = """
[[tenant]]
name = "search"
keys = ["sk-search-1", "sk-search-2"]
requests_per_s = 5

[[tenant]]
name = "indexer"
keys = ["sk-index"]
max_priority = "ingestion"
texts_per_s = 100.5
"""


def test_a_good_file_gives_its_tenants_with_defaults():
    search, indexer = parse_keys(GOOD)
    assert (search.name, search.keys, search.max_priority) == ("search", ("sk-search-1", "sk-search-2"), "query")
    assert (search.requests_per_s, search.texts_per_s) == (5.0, 0.0)
    assert (indexer.max_priority, indexer.requests_per_s, indexer.texts_per_s) == ("ingestion", 0.0, 100.5)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[[tenant]", "is not TOML"),
        ("", "names no tenant"),
        ("x = 1", "only [[tenant]] tables"),
        ('[[tenant]]\nname = "a b"\nkeys = ["k"]', "tenant 'a b': name must be"),
        ('[[tenant]]\nkeys = ["k"]', "tenant #1: name must be"),
        ('[[tenant]]\nname = "a"\nkeys = []', "tenant 'a': keys must be"),
        ('[[tenant]]\nname = "a"\nkeys = [" k"]', "tenant 'a': keys must be"),
        ('[[tenant]]\nname = "a"\nkeys = ["k"]\nmax_priority = "urgent"', "tenant 'a': max_priority must be"),
        ('[[tenant]]\nname = "a"\nkeys = ["k"]\nrequests_per_s = -1', "tenant 'a': requests_per_s must be"),
        ('[[tenant]]\nname = "a"\nkeys = ["k"]\ntexts_per_s = "9"', "tenant 'a': texts_per_s must be"),
        ('[[tenant]]\nname = "a"\nkeys = ["k"]\nrate = 1', "tenant 'a': unknown field(s) ['rate']"),
        (f'[[tenant]]\nname = "{ENV_TENANT}"\nkeys = ["k"]', "BERT_TRITON_API_KEY's"),
        ('[[tenant]]\nname = "a"\nkeys = ["k"]\n[[tenant]]\nname = "a"\nkeys = ["j"]', "a second tenant"),
        ('[[tenant]]\nname = "a"\nkeys = ["k"]\n[[tenant]]\nname = "b"\nkeys = ["k"]', "belongs to tenant 'a' too"),
    ],
)
def test_a_wrong_file_is_refused_naming_the_tenant_and_field(text, said):
    with pytest.raises(KeysError) as refused:
        parse_keys(text, "keys.toml")
    assert said in str(refused.value) and str(refused.value).startswith("keys.toml")


def test_a_bucket_refills_at_its_rate_up_to_one_second():
    assert refill(0.0, 0.0, 5.0, 10.0) == 10.0  # never counted: full
    assert refill(2.0, 1.0, 1.25, 10.0) == 4.5
    assert refill(2.0, 1.0, 9.0, 10.0) == 10.0
    assert refill(0.0, 1.0, 2.0, 0.5) == 0.5  # capacity at least one: here 0.5 tokens after 1 s
    assert take(3.0, 1, 10.0) == (2.0, 0.0)
    assert take(0.5, 1, 10.0) == (0.5, pytest.approx(0.05))
    assert take(10.0, 25, 10.0) == (-15.0, 0.0)  # larger than a full bucket: passes, in debt
    assert take(-15.0, 25, 10.0) == (-15.0, pytest.approx(2.5))  # then waits until the bucket is full
    assert [retry_after(w) for w in (0.01, 1.0, 1.2)] == [1, 1, 2]


def test_buckets_refuse_past_the_rate_and_count(tmp_path):
    buckets = SharedBuckets(tmp_path / "b")
    passed = [buckets.charge("t", "api", 1, 5, 0, 0) == 0.0 for _ in range(8)]
    assert passed == [True] * 5 + [False] * 3
    assert 0 < buckets.charge("t", "api", 1, 5, 0, 0) <= 0.2
    assert buckets.charge("t", "http", 1, 0, 300, 100) == 0.0  # texts: a full bucket lets 300 pass, in debt...
    assert buckets.charge("t", "http", 0, 0, 1, 100) == pytest.approx(2.01, abs=0.05)  # ...until paid back
    buckets.count("", "grpc", "401")
    counts = buckets.counters()
    assert counts["t"]["api", "requests"] == 9 and counts["t"]["api", "429"] == 4
    assert counts["t"]["http", "requests"] == 1 and counts["t"]["http", "429"] == 1
    assert counts[""]["grpc", "401"] == 1
    buckets.close()


def _hammer(path, start: float, seconds: float, rate: float, results) -> None:
    """Charge from `start` (the parent's monotonic clock, which forked processes share) for `seconds`: one window
    for all, however late each process starts on a loaded machine."""
    buckets, passed = SharedBuckets(path), 0
    time.sleep(max(0.0, start - time.monotonic()))
    while time.monotonic() < start + seconds:
        passed += buckets.charge("shared", "api", 1, rate, 0, 0) == 0.0
    results.put(passed)


def test_processes_share_one_rate(tmp_path):
    """Three processes asking as fast as they can get the rate together (plus the first second's bucket)."""
    rate, seconds = 200.0, 2.0
    results = multiprocessing.get_context("fork").Queue()
    start = time.monotonic() + 1.0
    workers = [
        multiprocessing.get_context("fork").Process(
            target=_hammer, args=(tmp_path / "b", start, seconds, rate, results)
        )
        for _ in range(3)
    ]
    for worker in workers:
        worker.start()
    total = sum(results.get(timeout=30) for _ in workers)
    for worker in workers:
        worker.join()
    assert total == pytest.approx(rate * seconds + rate, rel=0.1)


def test_keys_are_identified_and_a_changed_file_is_read_again(tmp_path, monkeypatch):
    monkeypatch.delenv("BERT_TRITON_API_KEY", raising=False)
    keys = tmp_path / "keys.toml"
    keys.write_text(GOOD)
    deployment = load_deployment([], [f'tenants.keys_file="{keys}"'])
    tenants = Tenants(keys, 0.2, SharedBuckets(tmp_path / "b"), "http", deployment)
    assert tenants.identify("Bearer sk-search-2").name == "search"
    assert tenants.identify("bearer  sk-index").name == "indexer"
    for wrong in (None, "", "Bearer", "Bearer sk-search", "Basic sk-index", "sk-index"):
        assert tenants.identify(wrong) is None
    keys.write_text(GOOD.replace("sk-index", "sk-index-new"))
    time.sleep(0.3)
    assert tenants.identify("Bearer sk-index") is None
    assert tenants.identify("Bearer sk-index-new").name == "indexer"
    keys.write_text("[[tenant]]\nname = 'broken'")  # a broken file: the last good one stays
    time.sleep(0.3)
    assert tenants.identify("Bearer sk-index-new").name == "indexer"
    monkeypatch.setenv("BERT_TRITON_API_KEY", "env-key")
    keys.write_text(GOOD)
    time.sleep(0.3)
    assert tenants.identify("Bearer env-key").name == ENV_TENANT


def test_the_priority_ceiling(tmp_path):
    keys = tmp_path / "keys.toml"
    keys.write_text(GOOD)
    deployment = load_deployment([], [f'tenants.keys_file="{keys}"'])
    tenants = Tenants(keys, 2.0, SharedBuckets(tmp_path / "b"), "grpc", deployment)
    search, indexer = (tenants.identify(f"Bearer {k}") for k in ("sk-search-1", "sk-index"))
    assert not tenants.needs_shape(search) and tenants.needs_shape(indexer)
    assert tenants.priority_problem(search, "ensemble-query") is None
    assert tenants.priority_problem(indexer, "ensemble") is None
    assert "not its query lane 'ensemble-query'" in tenants.priority_problem(indexer, "ensemble-query")
    # the model itself takes both classes: a query sent there is a request naming lane = "query"
    assert tenants.priority_problem(search, "ensemble", "query") is None
    assert 'no lane = "query"' in tenants.priority_problem(indexer, "ensemble", "query")
    assert 'code="403"' in tenants.prometheus() and 'tenant="indexer",front="grpc"' in tenants.prometheus()
