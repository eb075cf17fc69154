"""python -m bench.gpu_metrics_check: under load, are the GPU metrics on the metrics port real (non-zero)?

Triton's own nv_gpu_utilization needs DCGM, which the wheel's tritonserver lacks; the launcher serves the metrics
port itself with NVML's readings in their place (serving/launcher/metrics_port.py). This starts the real
launcher (python -m serving.launcher) on free ports from --settings and the export of those settings,
or uses a running server (--url and --metrics-url), sends closed-loop gRPC requests of corpus texts from
--users threads for --duration-s while scraping the metrics port every --interval-s, and records per GPU the
nv_gpu_utilization samples, memory, power and SM clock it read there. Writes --out (JSON) and the last scrape
beside it (.prom); exits 1 when no nv_gpu_utilization sample was above 0 (or there was none), 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

from client import TextClient
from loadtest.corpus import load_text
from settings import load_settings

WATCHED = (
    "nv_gpu_utilization",
    "nv_gpu_memory_used_bytes",
    "nv_gpu_power_usage",
    "bert_gpu_sm_clock_hertz",
    "bert_launcher_tritonserver_metrics_up",
)


def gpu_samples(text: str) -> dict[str, dict[str, float]]:
    """metric -> gpu_uuid (or "" without one) -> value, for the WATCHED metrics in Prometheus text."""
    found: dict[str, dict[str, float]] = defaultdict(dict)
    for name, labels, value in re.findall(r"^([a-zA-Z_:][\w:]*)(?:{(.*?)})? (\S+)$", text, flags=re.M):
        if name in WATCHED:
            uuid = re.search(r'gpu_uuid="([^"]*)"', labels or "")
            found[name][uuid.group(1) if uuid else ""] = float(value)
    return found


def scrape(metrics_url: str) -> str:
    with urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=10) as response:
        return response.read().decode()


def load(url: str, texts: list[str], batch: int, stop: threading.Event, counts: list[int]) -> None:
    with TextClient(url, "grpc") as client:
        index = 0
        while not stop.is_set():
            client.embed([texts[(index + i) % len(texts)] for i in range(batch)])
            index += batch
            counts.append(1)


def measure(url: str, metrics_url: str, args) -> dict:
    texts = load_text()[:2000]
    stop, counts = threading.Event(), []
    workers = [
        threading.Thread(target=load, args=(url, texts, args.texts_per_request, stop, counts), daemon=True)
        for _ in range(args.users)
    ]
    for worker in workers:
        worker.start()
    scrapes: list[dict] = []
    started = time.monotonic()
    text = ""
    while time.monotonic() - started < args.duration_s:
        time.sleep(args.interval_s)
        text = scrape(metrics_url)
        scrapes.append(gpu_samples(text))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".prom").write_text(text)  # the last scrape, whole
    stop.set()
    for worker in workers:
        worker.join(timeout=30)
    elapsed = time.monotonic() - started
    per_gpu: dict[str, dict] = {}
    for uuid in sorted({uuid for s in scrapes for uuid in s.get("nv_gpu_utilization", {})}):

        def series(name: str, uuid: str = uuid) -> list[float]:
            return [s[name][uuid] for s in scrapes if uuid in s.get(name, {})]

        util, memory = series("nv_gpu_utilization"), series("nv_gpu_memory_used_bytes")
        power, clock = series("nv_gpu_power_usage"), series("bert_gpu_sm_clock_hertz")
        per_gpu[uuid] = {
            "utilization_samples": util,
            "utilization_mean": round(sum(util) / len(util), 3),
            "utilization_max": max(util),
            "memory_used_bytes_max": max(memory, default=None),
            "power_w_mean": round(sum(power) / len(power), 1) if power else None,
            "sm_clock_mhz_mean": round(sum(clock) / len(clock) / 1e6) if clock else None,
        }
    up = [
        s["bert_launcher_tritonserver_metrics_up"][""] for s in scrapes if "bert_launcher_tritonserver_metrics_up" in s
    ]
    return {
        "requests": len(counts),
        "requests_per_s": round(len(counts) / elapsed, 1),
        "scrapes": len(scrapes),
        "tritonserver_metrics_up": up,
        "gpus": per_gpu,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_metrics_check", description=__doc__)
    parser.add_argument("--settings", help="settings file (default: the default); its export must exist")
    parser.add_argument("--url", help="gRPC HOST:PORT of a running server (default: start the launcher)")
    parser.add_argument("--metrics-url", help="HOST:PORT of the running server's metrics port (with --url)")
    parser.add_argument("--users", type=int, default=32, help="threads, each one request in flight")
    parser.add_argument("--texts-per-request", type=int, default=8)
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--interval-s", type=float, default=1.0, help="between scrapes of the metrics port")
    parser.add_argument("--out", type=Path, default=Path("build/bench/gpu_metrics_check.json"))
    args = parser.parse_args(argv)
    if bool(args.url) != bool(args.metrics_url):
        parser.error("--url and --metrics-url go together")
    settings = load_settings(args.settings)
    if args.url:
        result = measure(args.url, args.metrics_url, args)
    else:
        from model_repository.generate import generate
        from serving.launcher.harness import Launcher
        from serving.launcher.triton_command import Ports

        work = Path(tempfile.mkdtemp(prefix="gpu_metrics_check_"))
        repository = generate(settings, settings.export_dir, work / "repository")
        ports = Ports.free()
        launcher = Launcher(settings.path, repository, ports, work / "launcher.log").start()
        try:
            result = measure(f"127.0.0.1:{ports.grpc}", f"127.0.0.1:{ports.metrics}", args)
        finally:
            launcher.kill()
        log = (work / "launcher.log").read_text(errors="replace")
        result["launcher_log"] = [line for line in log.splitlines() if line.startswith("launcher:")]
    result |= {"settings_file": str(settings.path), "users": args.users, "texts_per_request": args.texts_per_request}
    busy = [uuid for uuid, gpu in result["gpus"].items() if gpu["utilization_max"] > 0]
    result["verdict"] = "ok: nv_gpu_utilization > 0 under load" if busy else "FAIL: nv_gpu_utilization never above 0"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for uuid, gpu in result["gpus"].items():
        print(
            f"{uuid}: utilization mean {gpu['utilization_mean']:.2f} max {gpu['utilization_max']:.2f}, "
            f"power {gpu['power_w_mean']} W, SM {gpu['sm_clock_mhz_mean']} MHz, "
            f"memory {gpu['memory_used_bytes_max']} B"
        )
    print(f"{result['requests_per_s']} req/s over {result['scrapes']} scrapes; {result['verdict']} ({args.out})")
    return 0 if busy else 1


if __name__ == "__main__":
    sys.exit(main())
