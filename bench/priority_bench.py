"""python -m bench.priority_bench: single-text queries beside saturating ingestion, with the query lane and with one
queue for every request, in one call; then requests whose time budget cannot be met.

    python -m bench.priority_bench --out DIR [--settings FILE] [--query-rate 50] [--ingestion-clients 16]
        [--ingestion-texts 64] [--duration 20] [--deadline-requests 1000] [--budget-ms 5] [--deadline-processes 1 8]
        [--modes lanes one_queue tenants] [--noisy-rate 100] [--noisy-limit 20]

For each mode (`lanes`: priority.enabled, queries to the model's query lane; `one_queue`: priority.enabled =
false) it generates the repository from the export `make export` left (model_repository.generate), starts the
real launcher on free ports and drives its API front (POST /v1/embeddings, texts of loadtest/corpus.txt):
- queries alone: one text a request at --query-rate requests/s, an open loop (each sent on time, whatever the
  answers before it);
- ingestion alone: --ingestion-clients closed loops of --ingestion-texts texts a request, each a process of its own
  (so that the clients' own work, 64 answers of 768 floats a request, never delays the queries' clock);
- both at once: the queries' latency and the ingestion's texts/s beside each other.
Issue 45's bars: queries' p99 beside ingestion <= 2x their p99 alone + 5 ms, ingestion beside queries >= 0.9x
alone.
Then, in `lanes` with ingestion running: --deadline-requests requests of one text, sent as ingestion
(X-Priority) with X-Request-Timeout: --budget-ms ms, 64 at a time (from one process, or shared among each of
--deadline-processes' counts of processes, a run each): each must be answered 504 within 2x its budget
+ 5 ms, and none may be run: the sequences the stage encoded (its bert_encoder_sequences_per_execute_sum,
canary off) equal the rows answered 200, and the stage counts each one it refused (bert_requests_expired_total).
Triton's nv_inference_count is kept beside them: it counts a request the stage refused as an inference.
Requests with room to spare (a 30 s budget) are served.
`tenants` (not run unless named): a keys file of two tenants, `calm` unlimited and `noisy` limited to
--noisy-limit requests/s. The calm tenant's one-text queries at --query-rate alone, then beside the noisy tenant
sending one-text requests at --noisy-rate in an open loop: issue 45's bar, the calm p99 beside <= 2x alone + 5 ms.
Writes DIR/priority_bench.json, and each mode's launcher log as DIR/priority_launcher_<mode>.log.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

from bench.record import header, write
from loadtest.corpus import load_text
from loadtest.triton_stats import scrape_metrics
from model_repository.generate import generate
from protocol.api_key import api_key, headers
from serving.api.priority import PRIORITY_HEADER, TIMEOUT_HEADER
from serving.launcher.harness import Launcher
from serving.launcher.triton_command import Ports
from settings import load_settings

MODES = {"lanes": ["priority.enabled=true"], "one_queue": ["priority.enabled=false"], "tenants": []}
KEYS = """
[[tenant]]
name = "calm"
keys = ["calm-1"]

[[tenant]]
name = "noisy"
keys = ["noisy-1"]
requests_per_s = {limit}
"""
# The canary's own inferences would blur the count of rows Triton ran.
QUIET = ["server.canary_interval_s=0"]
AT_ONCE = 64  # deadline requests in flight together


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


class Driver:
    """Requests to one API front's /v1/embeddings from one aiohttp session."""

    def __init__(self, url: str, model: str, texts: list[str]) -> None:
        self.url, self.model, self.corpus, self.texts = url, model, texts, itertools.cycle(texts)
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Driver:
        connector = aiohttp.TCPConnector(limit=0)
        self.session = aiohttp.ClientSession(connector=connector, headers=headers(api_key()))
        return self

    async def __aexit__(self, *_) -> None:
        await self.session.close()

    async def post(self, texts: int, extra: dict | None = None) -> tuple[int, float]:
        """(status, seconds) of one request of `texts` texts."""
        body = {"model": self.model, "input": [next(self.texts) for _ in range(texts)], "encoding_format": "base64"}
        started = time.perf_counter()
        async with self.session.post(self.url, json=body, headers=extra) as response:
            await response.read()
            return response.status, time.perf_counter() - started

    async def bursts(self, extra: dict, count: int, at_once: int) -> list[tuple[int, float]]:
        """(status, seconds) of `count` one-text requests, `at_once` sent together, the next when all are answered."""
        answers = []
        for start in range(0, count, at_once):
            answers += await asyncio.gather(*(self.post(1, extra) for _ in range(min(at_once, count - start))))
        return answers

    async def connect(self, connections: int) -> None:
        """`connections` connections open to the front (GET /v1/models), so that no timed request opens one."""

        async def get() -> None:
            async with self.session.get(self.url.rsplit("/", 1)[0] + "/models") as response:
                await response.read()

        await asyncio.gather(*(get() for _ in range(connections)))

    async def queries(self, rate: float, duration_s: float, extra: dict | None = None) -> dict:
        """One text a request at `rate`/s for duration_s, each sent on time: p50/p95/p99 of those answered 200,
        and how many got each status."""
        start, sent = time.perf_counter(), []
        for index in range(int(rate * duration_s)):
            await asyncio.sleep(max(0.0, start + index / rate - time.perf_counter()))
            sent.append(asyncio.create_task(self.post(1, extra)))
        answers = await asyncio.gather(*sent)
        latencies = [seconds * 1000 for status, seconds in answers if status == 200]
        return {
            "requests": len(answers),
            "failed": len(answers) - len(latencies),
            "statuses": {str(code): count for code, count in sorted(Counter(s for s, _ in answers).items())},
            "p50_ms": round(percentile(latencies, 0.5), 2),
            "p95_ms": round(percentile(latencies, 0.95), 2),
            "p99_ms": round(percentile(latencies, 0.99), 2),
        }

    async def ingestion(self, clients: int, texts: int, duration_s: float) -> dict:
        """Ingestion alone for duration_s (Ingestion.stop's figures)."""
        load = await Ingestion(self, clients, texts).start()
        await asyncio.sleep(duration_s)
        return await load.stop()

    async def saturated(self, clients: int, texts: int, work, warm_s: float = 1.0) -> tuple[dict, object]:
        """Ingestion running (after warm_s) while `work` is awaited: (ingestion's figures, work's result)."""
        load = await Ingestion(self, clients, texts).start()
        try:
            await asyncio.sleep(warm_s)
            result = await work
        finally:
            figures = await load.stop()
        return figures, result


class Ingestion:
    """`clients` closed loops of `texts` texts a request to the driver's route, each a process of its own."""

    def __init__(self, driver: Driver, clients: int, texts: int) -> None:
        spawn = multiprocessing.get_context("spawn")  # this process runs an event loop: no fork
        self.halt, self.answers = spawn.Event(), spawn.Queue()
        loop_args = (driver.url, driver.model, driver.corpus, texts, self.halt, self.answers)
        self.processes = [spawn.Process(target=ingestion_client, args=loop_args, daemon=True) for _ in range(clients)]

    async def _answers(self) -> list:
        """One answer from each process (queue.Empty after 120 s: a process died)."""
        loop = asyncio.get_running_loop()
        return [await loop.run_in_executor(None, self.answers.get, True, 120) for _ in self.processes]

    async def start(self) -> Ingestion:
        """Once every loop has had its first answer."""
        for process in self.processes:
            process.start()
        await self._answers()
        return self

    async def stop(self) -> dict:
        """texts/s answered 200 (each loop's own rate, summed), requests failed, and every text answered 200."""
        self.halt.set()
        answers = await self._answers()
        for process in self.processes:
            process.join(timeout=30)
        return {
            "texts_per_s": round(sum(timed / seconds for _, timed, _, seconds in answers), 1),
            "failed": sum(failed for _, _, failed, _ in answers),
            "texts": sum(served for served, _, _, _ in answers),
        }


class Bursts:
    """Deadline requests from `processes` processes, each sending its share AT_ONCE // processes at a time, so that
    AT_ONCE are in flight in all as from one process, but no one client's loop reads them all: from one aiohttp
    process, 64 at a time to a server that answers each at 5 ms measured 21 ms at the median on 2 cores
    (docs/results/cpu-2026-12-06/deadline-client/)."""

    def __init__(self, driver: Driver, extra: dict, count: int, processes: int) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.go, self.queue = spawn.Event(), spawn.Queue()
        shares = [count // processes + (index < count % processes) for index in range(processes)]
        at_once = max(1, AT_ONCE // processes)
        self.processes = [
            spawn.Process(
                target=burst_client,
                args=(driver.url, driver.model, driver.corpus, extra, share, at_once, self.go, self.queue),
                daemon=True,
            )
            for share in shares
        ]

    async def answers(self) -> list[tuple[int, float]]:
        """Once every process is connected, all sent at once: every process's (status, seconds)."""
        loop = asyncio.get_running_loop()
        for process in self.processes:
            process.start()
        for _ in self.processes:
            await loop.run_in_executor(None, self.queue.get, True, 120)
        self.go.set()
        answers = []
        for _ in self.processes:
            answers += await loop.run_in_executor(None, self.queue.get, True, 120)
        for process in self.processes:
            process.join(timeout=30)
        return answers


def burst_client(url: str, model: str, corpus: list[str], extra: dict, count: int, at_once: int, go, queue) -> None:
    """One of Bursts' processes: puts None once connected, then, after `go`, its requests' (status, seconds)."""

    async def run() -> None:
        async with Driver(url, model, corpus) as driver:
            await driver.connect(at_once)
            queue.put(None)
            go.wait()
            queue.put(await driver.bursts(extra, count, at_once))

    asyncio.run(run())


def ingestion_client(url: str, model: str, corpus: list[str], texts: int, halt, answers) -> None:
    """One ingestion loop (Ingestion's processes): puts None after its first answer, then, once `halt` is set,
    (texts answered 200 in all, those of the timed loop, requests failed, the timed loop's seconds)."""

    async def run() -> None:
        async with Driver(url, model, corpus) as driver:
            status, _ = await driver.post(texts)
            served, failed = texts * (status == 200), int(status != 200)
            answers.put(None)
            started, timed = time.perf_counter(), 0
            while not halt.is_set():
                status, _ = await driver.post(texts)
                timed, failed = timed + texts * (status == 200), failed + (status != 200)
            answers.put((served + timed, timed, failed, time.perf_counter() - started))

    asyncio.run(run())


async def contention(driver: Driver, args) -> dict:
    """Queries alone, ingestion alone, and both, with the issue's two ratios."""
    alone = await driver.queries(args.query_rate, args.duration)
    ingestion_alone = await driver.ingestion(args.ingestion_clients, args.ingestion_texts, args.duration)
    beside, queries = await driver.saturated(
        args.ingestion_clients, args.ingestion_texts, driver.queries(args.query_rate, args.duration)
    )
    return {
        "queries_alone": alone,
        "ingestion_alone": ingestion_alone,
        "queries_beside_ingestion": queries,
        "ingestion_beside_queries": beside,
        "query_p99_ratio": round(queries["p99_ms"] / alone["p99_ms"], 2),
        "ingestion_ratio": round(beside["texts_per_s"] / max(ingestion_alone["texts_per_s"], 1e-9), 3),
    }


async def tenants(driver: Driver, args) -> dict:
    """The calm tenant's queries alone, then beside the noisy tenant over its rate."""
    calm, noisy = bearer("calm-1"), bearer("noisy-1")
    alone = await driver.queries(args.query_rate, args.duration, calm)
    beside, flood = await asyncio.gather(
        driver.queries(args.query_rate, args.duration, calm),
        driver.queries(args.noisy_rate, args.duration, noisy),
    )
    return {
        "calm_alone": alone,
        "calm_beside_noisy": beside,
        "noisy": flood,
        "noisy_rate": args.noisy_rate,
        "noisy_limit": args.noisy_limit,
        "calm_p99_bound_ms": round(2 * alone["p99_ms"] + 5, 2),
    }


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def deadlines(driver: Driver, args, metrics_url: str, model: str, processes: int) -> dict:
    """Requests with a budget they cannot meet, sent AT_ONCE at a time from `processes` processes, then some with room
    to spare, beside ingestion; the rows the stage encoded (and those Triton counts) against the rows answered 200."""
    await asyncio.sleep(2.5)  # the stubs send their counts about once a second: the phases before are all in
    before = scrape_metrics(metrics_url).get(model, {})
    tight = {PRIORITY_HEADER: "ingestion", TIMEOUT_HEADER: f"{args.budget_ms}ms"}
    roomy = {PRIORITY_HEADER: "ingestion", TIMEOUT_HEADER: "30s"}

    if processes == 1:
        tight_sent = driver.bursts(tight, args.deadline_requests, AT_ONCE)
    else:
        tight_sent = Bursts(driver, tight, args.deadline_requests, processes).answers()
    ingestion, (tight_answers, roomy_answers) = await driver.saturated(
        args.ingestion_clients, args.ingestion_texts, asyncio.gather(tight_sent, driver.bursts(roomy, 16, AT_ONCE))
    )
    await asyncio.sleep(2.5)  # what Triton still held has run or been dropped, and the stubs sent their counts
    after = scrape_metrics(metrics_url).get(model, {})

    def grew(name: str) -> int:
        return int(after.get(name, 0.0) - before.get(name, 0.0))

    served = ingestion["texts"] + sum(status == 200 for status, _ in roomy_answers + tight_answers)
    encoded = grew("bert_encoder_sequences_per_execute_sum")
    bound_ms = 2 * args.budget_ms + 5
    late = [seconds * 1000 for status, seconds in tight_answers]
    return {
        "budget_ms": args.budget_ms,
        "client_processes": processes,
        "requests": len(tight_answers),
        "answered_504": sum(status == 504 for status, _ in tight_answers),
        "answered_200": sum(status == 200 for status, _ in tight_answers),
        "p50_ms": round(percentile(late, 0.5), 2),
        "max_ms": round(max(late), 2),
        "within_bound": sum(ms <= bound_ms for ms in late),
        "bound_ms": bound_ms,
        "roomy_served": sum(status == 200 for status, _ in roomy_answers),
        "roomy_requests": len(roomy_answers),
        "refused_by_stage": grew("bert_requests_expired_total"),
        "rows_encoded_by_stage": encoded,
        "rows_answered_200": served,
        "rows_run_unanswered": encoded - served,
        "rows_counted_by_triton": grew("nv_inference_count"),
    }


async def drive_mode(ports: Ports, model: str, texts: list[str], args, mode: str) -> dict:
    url = f"http://127.0.0.1:{ports.api}/v1/embeddings"
    async with Driver(url, model, texts) as driver:
        if mode == "tenants":
            return await tenants(driver, args)
        figures = await contention(driver, args)
        if mode == "lanes" and args.deadline_requests > 0:
            metrics = f"http://127.0.0.1:{ports.metrics}/metrics"
            for processes in args.deadline_processes:  # the first as "deadlines", the earlier runs' key
                key = "deadlines" if processes == args.deadline_processes[0] else f"deadlines_{processes}_processes"
                figures[key] = await deadlines(driver, args, metrics, "ensemble", processes)
        return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.priority_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--settings", type=Path, help="default: settings/defaults.toml")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="a settings override")
    parser.add_argument("--query-rate", type=float, default=50.0)
    parser.add_argument("--ingestion-clients", type=int, default=16)
    parser.add_argument("--ingestion-texts", type=int, default=64)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of each phase")
    parser.add_argument("--deadline-requests", type=int, default=1000)
    parser.add_argument("--budget-ms", type=float, default=5.0)
    parser.add_argument(
        "--deadline-processes",
        type=int,
        nargs="+",
        default=[1],
        help=f"client processes the deadline requests come from, {AT_ONCE} at a time in all (each a run of its own)",
    )
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=["lanes", "one_queue"])
    parser.add_argument("--noisy-rate", type=float, default=100.0, help="tenants: the noisy tenant's requests/s")
    parser.add_argument("--noisy-limit", type=float, default=20.0, help="tenants: its requests_per_s in the keys file")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    texts = load_text()
    record = {**header("priority_bench", argv), "modes": {}}
    for mode in args.modes:
        work = Path(tempfile.mkdtemp(prefix=f"priority-{mode}-"))
        overrides = MODES[mode]
        if mode == "tenants":
            keys = work / "keys.toml"
            keys.write_text(KEYS.format(limit=args.noisy_limit))
            overrides = [f'tenants.keys_file="{keys}"']
        settings = load_settings(args.settings, [*args.set, *overrides, *QUIET])
        repository = generate(settings, settings.export_dir, work / "repository")
        ports = Ports.free()
        launcher = Launcher(
            args.settings or settings.path,
            repository,
            ports,
            args.out / f"priority_launcher_{mode}.log",  # beside the figures: a run cut short still says why
            [*args.set, *overrides, *QUIET],
        )
        try:
            launcher.start()
            figures = asyncio.run(drive_mode(ports, settings.model.name, texts, args, mode))
        finally:
            launcher.terminate()
            launcher.process.wait(timeout=120)
        record["modes"][mode] = figures
        print(mode, figures, flush=True)
    lanes = record["modes"].get("lanes")
    if lanes is not None:
        alone_ms, beside_ms = lanes["queries_alone"]["p99_ms"], lanes["queries_beside_ingestion"]["p99_ms"]
        record["bars"] = {
            "query_p99_beside_ingestion_le_2x_alone_plus_5ms": beside_ms <= 2 * alone_ms + 5,
            "ingestion_ge_0.9x_alone": lanes["ingestion_ratio"] >= 0.9,
        }
    calm = record["modes"].get("tenants")
    if calm is not None:
        record.setdefault("bars", {})["calm_p99_beside_noisy_le_2x_alone_plus_5ms"] = (
            calm["calm_beside_noisy"]["p99_ms"] <= calm["calm_p99_bound_ms"]
        )
    write(args.out, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
