"""The Coalescer's policy (serving/api/coalescer.py) against a link that records its calls and answers each row
with its own text's length after a delay the test controls: who waits, who goes at once, how calls are bounded,
and what a refused call or a departed client does. The real server's answers: tests/server/test_api_coalescing.py."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from serving.api.coalescer import Coalescer
from serving.api.request_context import CURRENT, RequestContext
from serving.api.triton_errors import BadInput, Overloaded


class RecordingLink:
    """TritonLink's infer() signature; each call is recorded, held until `release` is set, and answered with each
    row's byte length (or refused as Triton would refuse a text starting with b"bad")."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[bytes], int]] = []
        self.ids: list[str] = []
        self.release = asyncio.Event()
        self.release.set()
        self.fail: Exception | None = None

    async def infer(
        self,
        model,
        inputs,
        outputs,
        max_texts,
        max_bytes,
        requests=1,
        request_id="",
        trace=None,
        parameters=None,
        timeout_s=None,
    ):
        texts = inputs["TEXT"]
        self.calls.append((list(texts), requests))
        self.ids.append(request_id)
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        if any(text.startswith(b"bad") for text in texts):
            raise BadInput("a text was refused")
        return {"length": np.array([len(text) for text in texts]), "tokens": np.arange(len(texts))}


def coalescer(link, max_calls=2, window_s=0.0, max_texts=8, max_bytes=1000) -> Coalescer:
    return Coalescer(link, "ensemble", ["length", "tokens"], max_texts, max_bytes, max_calls, window_s)


def texts(*words: str) -> dict[str, list[bytes]]:
    return {"TEXT": [word.encode() for word in words]}


async def concurrently(target: Coalescer, requests: list[dict]) -> list:
    return await asyncio.gather(*(target.infer(request) for request in requests), return_exceptions=True)


def test_a_lone_request_goes_at_once_even_with_a_window():
    async def scenario():
        link = RecordingLink()
        started = asyncio.get_running_loop().time()
        answer = await coalescer(link, window_s=5.0).infer(texts("alone"))
        return link, answer, asyncio.get_running_loop().time() - started

    link, answer, seconds = asyncio.run(scenario())
    assert link.calls == [([b"alone"], 1)] and answer["length"].tolist() == [5]
    assert seconds < 1.0, "the window applies only while a call is in flight"


def test_requests_that_queue_behind_busy_calls_share_the_next_call_and_get_their_own_rows():
    async def scenario():
        link = RecordingLink()
        link.release.clear()
        target = coalescer(link, max_calls=1)
        gathered = asyncio.ensure_future(concurrently(target, [texts("a"), texts("bb", "ccc"), texts("dddd")]))
        await asyncio.sleep(0.01)
        link.release.set()
        return link, await gathered

    link, answers = asyncio.run(scenario())
    assert link.calls == [([b"a"], 1), ([b"bb", b"ccc", b"dddd"], 2)]
    assert [answer["length"].tolist() for answer in answers] == [[1], [2, 3], [4]]
    assert [answer["tokens"].tolist() for answer in answers] == [[0], [0, 1], [2]], "rows split where they joined"


def test_a_call_holds_at_most_max_texts_and_max_bytes_and_a_big_request_goes_alone():
    async def scenario():
        link = RecordingLink()
        link.release.clear()
        target = coalescer(link, max_calls=1, max_texts=3, max_bytes=10)
        requests = [
            texts("first"),
            texts("a"),
            texts("b", "c"),
            texts("d"),  # a fourth text: the next call
            texts("ninechars"),  # 1 + 9 bytes fit, 2 more do not
            texts("xy"),
            texts("e" * 13),  # over max_bytes alone, and ...
            texts("f", "g", "h"),  # ... max_texts alone: calls of their own, not queued
        ]
        gathered = asyncio.ensure_future(concurrently(target, requests))
        await asyncio.sleep(0.01)
        link.release.set()
        return link, await gathered

    link, answers = asyncio.run(scenario())
    assert sorted(link.calls[:3]) == [([b"e" * 13], 1), ([b"f", b"g", b"h"], 1), ([b"first"], 1)]
    assert link.calls[3:] == [
        ([b"a", b"b", b"c"], 2),
        ([b"d", b"ninechars"], 2),
        ([b"xy"], 1),
    ]
    assert [answer["length"].tolist() for answer in answers] == [[5], [1], [1, 1], [1], [9], [2], [13], [1, 1, 1]]


def test_the_window_lets_a_batch_fill_while_a_call_is_in_flight():
    async def scenario():
        link = RecordingLink()
        link.release.clear()
        target = coalescer(link, max_calls=2, window_s=0.05)
        first = asyncio.ensure_future(target.infer(texts("first")))
        await asyncio.sleep(0.001)
        later = [asyncio.ensure_future(target.infer(texts(word))) for word in ("x", "y", "z")]
        await asyncio.sleep(0.01)
        waiting = len(link.calls)
        await asyncio.sleep(0.1)
        link.release.set()
        await asyncio.gather(first, *later)
        return link, waiting

    link, waiting = asyncio.run(scenario())
    assert waiting == 1, "inside the window the second call is not sent yet"
    assert link.calls == [([b"first"], 1), ([b"x", b"y", b"z"], 3)]


def test_a_refused_coalesced_call_fails_only_the_request_with_the_bad_text():
    async def scenario():
        link = RecordingLink()
        link.release.clear()
        target = coalescer(link, max_calls=1)
        gathered = asyncio.ensure_future(concurrently(target, [texts("busy"), texts("ok"), texts("bad"), texts("ok2")]))
        await asyncio.sleep(0.01)
        link.release.set()
        return link, await gathered

    link, answers = asyncio.run(scenario())
    assert ([b"ok", b"bad", b"ok2"], 3) in link.calls, "the three queued together"
    assert isinstance(answers[2], BadInput)
    assert [answers[i]["length"].tolist() for i in (0, 1, 3)] == [[4], [2], [3]]


def test_a_failed_call_fails_every_request_in_it():
    async def scenario():
        link = RecordingLink()
        link.release.clear()
        target = coalescer(link, max_calls=1)
        gathered = asyncio.ensure_future(concurrently(target, [texts("a"), texts("b"), texts("c")]))
        await asyncio.sleep(0.01)
        link.fail = Overloaded("queue full")
        link.release.set()
        return await gathered

    assert all(isinstance(answer, Overloaded) for answer in asyncio.run(scenario()))


def test_a_request_whose_client_left_gives_up_its_place_in_the_queue():
    async def scenario():
        link = RecordingLink()
        link.release.clear()
        target = coalescer(link, max_calls=1)
        busy = asyncio.ensure_future(target.infer(texts("busy")))
        await asyncio.sleep(0.001)
        leaving = asyncio.ensure_future(target.infer(texts("gone")))
        staying = asyncio.ensure_future(target.infer(texts("stays")))
        await asyncio.sleep(0.001)
        leaving.cancel()
        await asyncio.sleep(0.001)
        link.release.set()
        answers = await asyncio.gather(busy, staying)
        with pytest.raises(asyncio.CancelledError):
            await leaving
        return link, answers

    link, answers = asyncio.run(scenario())
    assert link.calls == [([b"busy"], 1), ([b"stays"], 1)]
    assert [answer["length"].tolist() for answer in answers] == [[4], [5]]


def test_coalesce_calls_zero_sends_every_request_on_its_own():
    async def scenario():
        link = RecordingLink()
        await concurrently(coalescer(link, max_calls=0), [texts("a"), texts("b"), texts("c")])
        return link

    assert sorted(asyncio.run(scenario()).calls) == [([b"a"], 1), ([b"b"], 1), ([b"c"], 1)]


def test_each_request_learns_how_long_it_queued_and_was_computed_and_triton_gets_their_ids():
    async def scenario():
        link = RecordingLink()
        link.release.clear()
        target = coalescer(link, max_calls=1)

        async def request(name: str, words: dict) -> RequestContext:
            context = RequestContext(name)
            CURRENT.set(context)  # as the guard middleware does, in this request's own task
            await target.infer(words)
            return context

        gathered = asyncio.ensure_future(
            asyncio.gather(request("first", texts("a")), request("second", texts("b")), request("third", texts("c")))
        )
        await asyncio.sleep(0.05)
        link.release.set()
        return link, await gathered

    link, (first, second, third) = asyncio.run(scenario())
    assert link.ids == ["first", "second,third"]
    assert first.queue_s < 0.01 <= first.inference_s, "the first went at once and its call was held"
    assert second.queue_s >= 0.04 and third.queue_s >= 0.04, "the others waited for the first call to end"
