"""Priority classes and time budgets in the API front (serving/api/priority.py), the query lane in the generated
repository (model_repository/configs.py) and the Coalescer's deadlines, without a server."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from common.gpu_board import GpuBoard
from model_repository.configs import python_models
from serving.api.coalescer import Coalescer
from serving.api.priority import budget_s, priority_class, settle
from serving.api.request_context import RequestContext
from serving.api.schema import ApiError
from serving.api.triton_errors import TimedOut
from serving.api.triton_link import WAY_BACK_S, stage_deadline_ns
from serving.launcher.tritonserver import TritonServer
from settings import ROOT, Deployment, load_settings
from settings.deployment import python_stubs
from settings.schema import SettingsError


@pytest.mark.parametrize(
    ("header", "expected"),
    [(None, None), ("query", "query"), ("Ingestion", "ingestion"), ("1", "query"), ("2", "ingestion")],
)
def test_x_priority_names_a_class(header, expected):
    assert priority_class(header) == expected


@pytest.mark.parametrize("header", ["urgent", "0", "3", ""])
def test_an_unknown_x_priority_is_refused_naming_the_header(header):
    with pytest.raises(ApiError, match="X-Priority") as refused:
        priority_class(header)
    assert refused.value.status == 400


@pytest.mark.parametrize(("header", "seconds"), [(None, None), ("0.25", 0.25), ("250ms", 0.25), ("2s", 2.0)])
def test_x_request_timeout_reads_seconds_or_a_unit(header, seconds):
    assert budget_s(header) == seconds


@pytest.mark.parametrize("header", ["0", "-1", "soon", "5 minutes", "inf", "1e999"])
def test_a_bad_x_request_timeout_is_refused_naming_the_header(header):
    with pytest.raises(ApiError, match="X-Request-Timeout") as refused:
        budget_s(header)
    assert refused.value.status == 400


def priority(**changes):
    return dataclasses.replace(load_settings().priority, **changes)


def test_the_class_follows_the_shape_unless_the_caller_names_one():
    settings = priority(query_max_texts=4)
    assert settle(RequestContext("a"), settings, 4, 60) == "query"
    assert settle(RequestContext("b"), settings, 5, 60) == "ingestion"
    assert settle(RequestContext("c", asked_class="query"), settings, 64, 60) == "query"
    assert settle(RequestContext("d", asked_class="ingestion"), settings, 1, 60) == "ingestion"


def test_a_tenant_capped_at_ingestion_never_sends_a_query():
    capped = RequestContext("a", max_class="ingestion", asked_class="query")
    assert settle(capped, priority(), 1, 60) == "ingestion"


def test_the_budget_is_the_callers_else_the_classes_else_the_api_timeout():
    settings = priority(query_timeout_ms=50, ingestion_timeout_ms=0)
    given = RequestContext("a", budget_s=0.2)
    settle(given, settings, 1, 60)
    assert given.deadline == pytest.approx(given.started + 0.2)
    query = RequestContext("b")
    settle(query, settings, 1, 60)
    assert query.deadline == pytest.approx(query.started + 0.05)
    ingestion = RequestContext("c")
    settle(ingestion, settings, 100, 60)
    assert ingestion.deadline == pytest.approx(ingestion.started + 60)


def test_a_request_keeps_the_class_and_deadline_of_its_first_call():
    context = RequestContext("a")
    settle(context, priority(), 1, 60)
    deadline = context.deadline
    assert settle(context, priority(), 500, 60) == "query"
    assert context.deadline == deadline


def test_a_one_stage_model_gets_a_query_lane_of_its_own_instances():
    settings = load_settings(None, ["priority.query_instances=2", "encoder.instances=3"])
    deployment = Deployment.of(settings)
    names = deployment.names(settings)
    assert names.query_lane == "ensemble-query"
    assert python_models(settings, names) == ["ensemble", "ensemble-query"]
    assert python_stubs(settings) == 5
    off = load_settings(None, ["priority.enabled=false"])
    assert Deployment.of(off).names(off).query_lane == ""
    assert python_stubs(off) == off.encoder.instances


def test_query_instances_below_one_are_refused():
    with pytest.raises(SettingsError, match="query_instances"):
        load_settings(None, ["priority.query_instances=0"])


class SlowLink:
    """A TritonLink stand-in that answers each call after `seconds`, counting the rows it was sent."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.rows, self.timeouts = seconds, 0, []

    async def infer(self, model, inputs, outputs, *args, timeout_s=None, **kwargs):
        self.rows += len(inputs["TEXT"])
        self.timeouts.append(timeout_s)
        await asyncio.sleep(self.seconds)
        return {"embedding": [[0.0]] * len(inputs["TEXT"])}


def test_a_request_whose_budget_runs_out_in_the_queue_is_never_sent():
    async def run():
        link = SlowLink(0.2)
        coalescer = Coalescer(link, "m", ["embedding"], 256, 1 << 20, 1, 0.0)
        first = asyncio.create_task(coalescer.infer({"TEXT": [b"a"]}))
        await asyncio.sleep(0.01)
        started = time.perf_counter()
        with pytest.raises(TimedOut):
            await coalescer.infer({"TEXT": [b"b"]}, deadline=started + 0.05)
        waited = time.perf_counter() - started
        await first
        await asyncio.sleep(0.01)
        return link, waited

    link, waited = asyncio.run(run())
    assert waited < 0.15  # at its deadline, not when the call ahead of it ended
    assert link.rows == 1  # the first request's row only


def test_a_request_stops_waiting_at_its_own_deadline_while_its_call_runs_on():
    async def run():
        link = SlowLink(0.3)
        coalescer = Coalescer(link, "m", ["embedding"], 256, 1 << 20, 1, 0.0)
        started = time.perf_counter()
        in_call = asyncio.create_task(coalescer.infer({"TEXT": [b"a"]}, deadline=started + 0.05))
        await asyncio.sleep(0)  # its call is sent; the next request queues behind it
        queued = asyncio.create_task(coalescer.infer({"TEXT": [b"b"]}, deadline=started + 5.0))
        with pytest.raises(TimedOut):
            await in_call
        waited = time.perf_counter() - started
        return link, waited, await queued

    link, waited, answer = asyncio.run(run())
    assert waited < 0.2  # at its own deadline, not when its call ends (0.3 s)
    assert len(answer["embedding"]) == 1  # the request behind it still gets its own call and answer
    assert link.rows == 2


def test_a_call_of_its_own_is_answered_at_its_deadline_and_never_cancelled():
    """A budgeted request stops waiting at its deadline, and its client may leave, but its call runs to its end:
    tritonserver 2.51 can crash when a call's cancellation meets its answer (serving/api/triton_link.py)."""

    async def run():
        link = SlowLink(0.2)
        coalescer = Coalescer(link, "m", ["embedding"], 256, 1 << 20, 4, 0.0)
        started = time.perf_counter()
        with pytest.raises(TimedOut):
            await coalescer.infer({"TEXT": [b"a"]}, deadline=started + 0.05)
        waited = time.perf_counter() - started
        leaving = asyncio.create_task(coalescer.infer({"TEXT": [b"b"]}, deadline=started + 5.0))
        await asyncio.sleep(0.01)
        leaving.cancel()  # its client went away
        calls = list(coalescer._calls)
        ended = await asyncio.gather(*calls, return_exceptions=True)
        return waited, calls, ended

    waited, calls, ended = asyncio.run(run())
    assert waited < 0.15, "answered at its deadline, not when its call ended (0.2 s)"
    assert len(calls) == 2 and not any(call.cancelled() for call in calls) and ended == [None, None]


class RefusingLink(SlowLink):
    """As SlowLink, but a call of several texts is refused after `seconds`, as the stage refuses one whose budget
    cannot be met."""

    async def infer(self, model, inputs, outputs, *args, timeout_s=None, **kwargs):
        if len(inputs["TEXT"]) > 1:
            self.timeouts.append(timeout_s)
            await asyncio.sleep(self.seconds)
            raise TimedOut("the stage: its time budget ran out")
        return await super().infer(model, inputs, outputs, *args, timeout_s=timeout_s, **kwargs)


def test_budgeted_requests_share_a_call_whose_budget_is_their_earliest_deadline():
    """Requests with budgets of their own coalesce like any others; the call carries the earliest deadline, so the
    stage refuses it unrun where that one cannot be met (no row runs for a request answered 504)."""

    async def run():
        link = SlowLink(0.05)
        coalescer = Coalescer(link, "m", ["embedding"], 256, 1 << 20, 1, 0.0)
        started = time.perf_counter()
        first = asyncio.create_task(coalescer.infer({"TEXT": [b"a"]}, deadline=started + 5.0))
        await asyncio.sleep(0)  # its call is sent; the next two queue behind it and share the next call
        later = [
            asyncio.create_task(coalescer.infer({"TEXT": [text]}, deadline=started + budget))
            for text, budget in ((b"b", 3.0), (b"c", 1.0))
        ]
        return link, await asyncio.gather(first, *later)

    link, answers = asyncio.run(run())
    assert [len(answer["embedding"]) for answer in answers] == [1, 1, 1]
    assert link.rows == 3 and len(link.timeouts) == 2  # two calls: the second carried both queued requests
    assert 0.85 < link.timeouts[1] <= 1.0  # the earliest (1 s) less the 50 ms it queued, not the latest (3 s)


def test_a_coalesced_call_the_stage_refuses_goes_again_alone_for_each_request_with_time_left():
    async def run():
        link = RefusingLink(0.05)
        coalescer = Coalescer(link, "m", ["embedding"], 256, 1 << 20, 1, 0.0)
        started = time.perf_counter()
        first = asyncio.create_task(coalescer.infer({"TEXT": [b"a"]}, deadline=started + 5.0))
        await asyncio.sleep(0)  # its call is sent; the next two share the next one, sent at 50 ms, refused at 100
        spent = asyncio.create_task(coalescer.infer({"TEXT": [b"b"]}, deadline=started + 0.07))
        roomy = asyncio.create_task(coalescer.infer({"TEXT": [b"c"]}, deadline=started + 5.0))
        results = await asyncio.gather(first, spent, roomy, return_exceptions=True)
        return link, results[1:]

    link, (spent, roomy) = asyncio.run(run())
    assert isinstance(spent, TimedOut)
    assert len(roomy["embedding"]) == 1  # sent again alone, with its own budget
    assert link.rows == 2  # the first request's and the retried one's: the refused call ran none


def test_a_spent_budget_is_refused_before_any_call_and_a_call_carries_the_remaining_budget():
    async def run():
        link = SlowLink(0.0)
        coalescer = Coalescer(link, "m", ["embedding"], 256, 1 << 20, 4, 0.0)
        with pytest.raises(TimedOut):
            await coalescer.infer({"TEXT": [b"a"]}, deadline=time.perf_counter() - 0.001)
        await coalescer.infer({"TEXT": [b"b"]}, deadline=time.perf_counter() + 2.0)
        return link

    link = asyncio.run(run())
    assert link.rows == 1
    assert 1.5 < link.timeouts[0] <= 2.0


def test_the_stage_gets_the_budget_less_the_answers_way_back():
    """deadline_ns is WAY_BACK_S before the front's own deadline: what the stage finishes later comes back after the
    front has answered 504 (docs/probes.md, late_rows)."""
    before = time.monotonic_ns()
    deadline = stage_deadline_ns(0.050)
    after = time.monotonic_ns()
    assert before + int((0.050 - WAY_BACK_S) * 1e9) <= deadline <= after + int((0.050 - WAY_BACK_S) * 1e9)
    assert stage_deadline_ns(WAY_BACK_S / 2) < time.monotonic_ns(), "a budget under the way back is already spent"


def test_the_front_counts_each_class_by_outcome_and_its_queued_time(tmp_path):
    from serving.api.call_stats import CallStats

    one, other = (CallStats(9, ["ensemble", "ensemble-query"], tmp_path) for _ in range(2))  # one file: one pid
    one.count_class("query", "served", 0.25)
    other.count_class("query", "served", 0.5)
    other.count_class("ingestion", "timed_out")
    text = one.prometheus()
    assert 'bert_api_requests_total{class="query",outcome="served"} 2' in text
    assert 'bert_api_requests_total{class="ingestion",outcome="timed_out"} 1' in text
    assert 'bert_api_queue_seconds_total{class="query"} 0.750000' in text
    assert 'bert_api_call_texts_count{model="ensemble-query"} 0' in text


def test_a_gpu_board_named_to_the_launcher_outlives_its_tritonserver(tmp_path):
    """The chart names one board file to the launcher and to the api container beside it: the launcher keeps it
    when tritonserver stops, so that the front, which maps it, still shares it with the next tritonserver's stubs.
    A board of the launcher's own is removed; a server on CPUs takes no GPU turns and makes none."""
    gpu = load_settings(ROOT / "settings" / "variants" / "minilm-gpu.toml")
    named = tmp_path / "board"
    server = TritonServer(gpu, tmp_path, gpu_board=named)
    assert server.board_path == named
    GpuBoard(named).claim(0)  # a stub's
    server.stop()
    assert named.exists()
    own = TritonServer(gpu, tmp_path)
    GpuBoard(own.board_path).claim(0)
    own.stop()
    assert not own.board_path.exists()
    assert TritonServer(load_settings(), tmp_path, gpu_board=named).board_path is None
