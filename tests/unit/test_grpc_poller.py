"""The API front's gRPC client reads tritonserver's answers on grpcio's own poller (serving/processes.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from serving.processes import GRPC_EXPERIMENTS, prefer_grpc_poller

# Runs `python -m serving.api --help` and prints GRPC_EXPERIMENTS as it was when the first grpc module was imported.
AT_FIRST_GRPC_IMPORT = """
import builtins, os, runpy, sys
seen = []
real_import = builtins.__import__
def spy(name, *args, **kwargs):
    if not seen and (name == "grpc" or name.startswith("grpc.")):
        seen.append(repr(os.environ.get("GRPC_EXPERIMENTS")))
    return real_import(name, *args, **kwargs)
builtins.__import__ = spy
sys.argv = ["serving.api", "--help"]
try:
    runpy.run_module("serving.api", run_name="__main__")
except SystemExit:
    pass
print(seen[0] if seen else "grpc never imported")
"""


def test_the_poller_is_the_default_and_an_operators_setting_wins():
    environ: dict[str, str] = {}
    prefer_grpc_poller(environ)
    assert environ == {"GRPC_EXPERIMENTS": "-event_engine_client"}
    for chosen in ("", "event_engine_client"):  # empty: grpcio's own defaults
        environ = {"GRPC_EXPERIMENTS": chosen}
        prefer_grpc_poller(environ)
        assert environ == {"GRPC_EXPERIMENTS": chosen}


@pytest.mark.parametrize("started_with", [None, ""])
def test_the_api_worker_sets_it_before_grpc_is_imported(started_with):
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    if started_with is not None:
        env["GRPC_EXPERIMENTS"] = started_with
    run = subprocess.run(
        [sys.executable, "-c", AT_FIRST_GRPC_IMPORT], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    assert run.stdout.strip().splitlines()[-1] == repr(GRPC_EXPERIMENTS if started_with is None else started_with)
