"""The launcher started the way the server image starts it (docker/tritonserver.sh as TRITONSERVER_BIN), on the
wheel's tritonserver: extra flags, every metric the dashboard reads, the chart's readiness command, and a dead
stub reported by /ready and restarted by the watchdog while Triton's own readiness says 200."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from client import TextClient
from serving.launcher import harness
from serving.launcher.procfs import child_processes, running, stub_processes, stubs
from serving.launcher.triton_command import Ports
from serving.launcher.triton_install import (
    check_stub_python,
    prepare_backends,
    stub_environment,
    triton_home,
    triton_libs,
)
from tests.support import (
    CHART,
    DOCKER,
    GPU_METRICS,
    load_module,
    metric_names,
    samples,
    scrape,
)

healthcheck = load_module("healthcheck", DOCKER / "healthcheck.py")


# ---------------------------------------------------------------------------------------------------------
# The launcher started the way the server image starts it
# ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def image_like_server(settings, repository, tmp_path_factory):
    """python3 -m serving.launcher with the image's environment, on the wheel's tritonserver.

    TRITONSERVER_BIN is docker/tritonserver.sh with TRITONSERVER_REAL_BIN and TRITONSERVER_EXTRA_ARGS as in
    the image; TRITON_BACKENDS_DIR a backends folder with the Python backend (the image's
    /opt/tritonserver/backends). The settings file only differs from the default in free ports.
    """
    work = tmp_path_factory.mktemp("image_like")
    ports = Ports.free()
    text = settings.path.read_text()
    names = ("http_port", "grpc_port", "metrics_port", "health_port", "triton_http_port")
    values = (ports.http, ports.grpc, ports.metrics, ports.health, ports.triton_http)
    for name, port in zip(names, values, strict=True):
        text, count = re.subn(rf"^{name} = \d+", f"{name} = {port}", text, flags=re.M)
        assert count == 1
    (work / "settings.toml").write_text(text)
    env = stub_environment()
    _, python_version = check_stub_python(env)
    env.update(
        TRITONSERVER_BIN=str(DOCKER / "tritonserver.sh"),
        TRITONSERVER_REAL_BIN=str(triton_home() / "bin" / "tritonserver"),
        TRITON_BACKENDS_DIR=str(prepare_backends(work, python_version)),
        TRITONSERVER_EXTRA_ARGS="--metrics-config=summary_latencies=true",
        LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(triton_libs()), os.environ.get("LD_LIBRARY_PATH")])),
    )
    command = [sys.executable, "-m", "serving.launcher", "--settings", str(work / "settings.toml")]
    command += ["--repository", str(repository), "--host", "127.0.0.1"]
    log = (work / "server.log").open("wb")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    url = f"http://127.0.0.1:{ports.http}"
    deadline = time.monotonic() + 120

    def launcher_ready() -> bool:  # the launcher answers /ready once Triton is ready and its watchdog runs
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports.health}/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    while healthcheck.problem(url, timeout_s=2) or not launcher_ready():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the image-like server did not come up:\n{(work / 'server.log').read_text()[-3000:]}")
        time.sleep(0.5)
    yield dataclasses.make_dataclass("ImageLike", ["process", "ports", "url", "settings"])(process, ports, url, text)
    process.kill()  # tritonserver follows its launcher (PR_SET_PDEATHSIG); a drain would wait for the dead stub
    process.wait()


def triton_process(launcher: int) -> tuple[int, str, list[bytes]]:
    """The launcher's tritonserver child (beside it run the launcher's HTTP front and metrics port)."""
    (child,) = [child for child in child_processes(launcher) if child[2][0].endswith(b"tritonserver")]
    return child


def test_wrapper_passes_extra_flags_and_the_dashboard_metrics_exist(image_like_server, chart_dashboard_metrics):
    server = image_like_server
    # The launcher started tritonserver.sh, which exec'd tritonserver: the real binary.
    (_, _, cmdline) = triton_process(server.process.pid)
    assert Path(cmdline[0].decode()).name == "tritonserver"
    assert b"--metrics-config=summary_latencies=true" in cmdline
    assert cmdline.index(b"--metrics-config=summary_latencies=true") > cmdline.index(b"--log-verbose=0")

    with TextClient(f"127.0.0.1:{server.ports.http}", "http") as client:
        for _ in range(3):
            client.embed(["one request", "and another text"])
    metrics = scrape("127.0.0.1", server.ports.metrics)
    assert samples(metrics, "nv_inference_request_summary_us_count", model="ensemble") >= 3
    quantiles = set(re.findall(r'^nv_inference_request_summary_us{.*quantile="([^"]+)"', metrics, flags=re.M))
    assert {"0.5", "0.99"} <= quantiles

    exported = metric_names(metrics)
    exported |= {name.removesuffix(suffix) for name in exported for suffix in ("_bucket", "_sum", "_count")}
    missing = chart_dashboard_metrics - exported - GPU_METRICS
    assert not missing, f"the dashboard reads metrics tritonserver 2.51 does not export: {missing}"


@pytest.fixture(scope="module")
def chart_dashboard_metrics() -> set[str]:
    dashboard = json.loads((CHART / "dashboards" / "bert-triton.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    names = {name for expr in exprs for name in re.findall(r"\b((?:nv|bert)_[a-z0-9_]+)\b", expr)}
    assert GPU_METRICS - {"nv_energy_consumption"} <= names  # every GPU metric but the energy counter
    return names


def test_chart_readiness_command_against_the_image_like_server(image_like_server):
    import helm_python

    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render({"settings": {"toml": image_like_server.settings}}, name="t", namespace="t")
    deployment = yaml.safe_load(rendered["bert-triton/templates/deployment.yaml"])
    command = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["exec"]["command"]
    assert command[command.index("--url") + 1] == image_like_server.url  # the port from the settings
    # The rendered command, with this checkout's interpreter and script in place of the image's.
    local = {"python3": sys.executable, "/opt/bert-triton/docker/healthcheck.py": str(DOCKER / "healthcheck.py")}
    run = subprocess.run([local.get(part, part) for part in command], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr


def launcher_ready(server) -> tuple[int, dict]:
    return harness.launcher_ready(server.ports.health, timeout_s=5)


def test_a_dead_stub_fails_the_charts_probe_until_the_watchdog_restarts_it(image_like_server):
    """Triton 2.51 keeps /v2/health/ready at 200 with a dead stub: the chart's readiness probe (a real inference,
    docker/healthcheck.py) fails meanwhile, which is why it exists; the launcher's /ready reports the stage
    until its watchdog has restarted it and freed the dead stub's region, and the probe passes again. The server
    is left as it was found."""
    server = image_like_server
    (triton, _, _) = triton_process(server.process.pid)
    # The one-stage model: tokenizer and encoder in one stub.
    ((stub, region),) = [(stub.pid, stub.region) for stub in stubs(triton) if stub.model == "ensemble"]
    restarts = len(launcher_ready(server)[1].get("stub_restarts", []))
    os.kill(server.process.pid, signal.SIGSTOP)  # the launcher paused: its watchdog cannot restart the stub yet
    try:
        os.kill(stub, signal.SIGKILL)
        while running(stub):
            time.sleep(0.02)
        problem = healthcheck.problem(server.url)
        assert problem and "not healthy" in problem, problem
        assert healthcheck.main(["--url", server.url]) == 1
        with urllib.request.urlopen(f"{server.url}/v2/health/ready", timeout=5) as response:
            assert response.status == 200  # Triton's own readiness does not notice
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    reported, deadline = [], time.monotonic() + 60
    while (state := launcher_ready(server))[0] != 200 or len(state[1].get("stub_restarts", [])) == restarts:
        reported += state[1].get("problems", [])
        assert time.monotonic() < deadline, state
        time.sleep(0.05)
    assert any("ensemble" in problem for problem in reported), reported
    assert state[1]["stub_restarts"][-1]["model"] == "ensemble"
    assert healthcheck.main(["--url", server.url]) == 0
    assert stub_processes(triton)["ensemble"] != [stub]
    assert not (Path("/dev/shm") / region).exists(), "the watchdog freed the dead stub's shared memory"


# ---------------------------------------------------------------------------------------------------------
# The image's health check on the session's tritonserver
# ---------------------------------------------------------------------------------------------------------
def test_healthcheck_needs_a_real_inference(server):
    url = f"http://{server.http_url}"
    assert healthcheck.problem(url) is None
    assert healthcheck.main(["--url", url]) == 0
    assert "HTTP 404" in healthcheck.problem(url, model="no_such_model")
    assert "no answer" in healthcheck.problem("http://127.0.0.1:9", timeout_s=2)
    assert healthcheck.main(["--url", "http://127.0.0.1:9", "--timeout", "2"]) == 1
