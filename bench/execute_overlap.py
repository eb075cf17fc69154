"""python -m bench.execute_overlap: can one Python-backend instance of tritonserver 2.51 start a batch while
its last one is still running, and still answer KServe's unary ModelInfer? (Issue 24, item 3: tokenizing the
next batch while the GPU runs this one, so that fewer CUDA contexts each get bigger batches.)

Four probe models, each one instance, no GPU, in a repository of their own on the real tritonserver:
- `decoupled`: execute() hands its requests to a thread and returns at once; the thread answers them through
  their response senders. Called with unary ModelInfer, and with a gRPC stream.
- `decoupled_ensemble`: an ensemble whose one step is `decoupled`, called with unary ModelInfer.
- `async_execute`: `async def execute` that awaits HOLD_S (a stand-in for the GPU) before answering;
  PARALLEL unary calls at once, no batching: overlapped they take ~HOLD_S, one after the other PARALLEL x HOLD_S.
- `async_decoupled`: the same coroutine in a decoupled model, over PARALLEL gRPC streams.
Writes execute_overlap.json into --out.
"""

from __future__ import annotations

import argparse
import queue
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from bench import record
from serving.launcher.harness import local_server
from settings import load_settings

HOLD_S = 0.1
PARALLEL = 8

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
{policy}
input [{{ name: "X" data_type: TYPE_FP32 dims: [1] }}]
output [{{ name: "Y" data_type: TYPE_FP32 dims: [1] }}]
instance_group [{{ count: 1 kind: KIND_CPU }}]
"""
DECOUPLED = "model_transaction_policy { decoupled: true }"
ENSEMBLE = """name: "decoupled_ensemble"
platform: "ensemble"
max_batch_size: 0
input [{ name: "X" data_type: TYPE_FP32 dims: [1] }]
output [{ name: "Y" data_type: TYPE_FP32 dims: [1] }]
ensemble_scheduling { step [{ model_name: "decoupled" model_version: -1
  input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" } }] }
"""
HEADER = """import asyncio, queue, threading
import triton_python_backend_utils as pb_utils
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
def doubled(request):
    x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
    return pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)])
"""
MODELS = {
    "decoupled": (
        DECOUPLED,
        HEADER
        + """
class TritonPythonModel:
    def initialize(self, args):
        self.pending = queue.Queue()
        threading.Thread(target=self.answer, daemon=True).start()
    def execute(self, requests):
        self.pending.put([(r.get_response_sender(), doubled(r)) for r in requests])
    def answer(self):
        while True:
            for sender, response in self.pending.get():
                sender.send(response, flags=FINAL)
""",
    ),
    "async_execute": (
        "",
        HEADER
        + f"""
class TritonPythonModel:
    async def execute(self, requests):
        await asyncio.sleep({HOLD_S})
        return [doubled(r) for r in requests]
""",
    ),
    "async_decoupled": (
        DECOUPLED,
        HEADER
        + f"""
class TritonPythonModel:
    async def execute(self, requests):
        await asyncio.sleep({HOLD_S})
        for r in requests:
            r.get_response_sender().send(doubled(r), flags=FINAL)
""",
    ),
}


def write_repository(root: Path) -> None:
    for name, (policy, source) in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, policy=policy))
        (root / name / "1" / "model.py").write_text(source)
    (root / "decoupled_ensemble" / "1").mkdir(parents=True)
    (root / "decoupled_ensemble" / "config.pbtxt").write_text(ENSEMBLE)


def x_input() -> grpcclient.InferInput:
    x = grpcclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.ones(1, dtype=np.float32))
    return x


def unary(url: str, model: str) -> str:
    try:
        result = grpcclient.InferenceServerClient(url).infer(model, [x_input()])
        return f"answered {result.as_numpy('Y').tolist()}"
    except grpcclient.InferenceServerException as exc:
        return f"refused: {exc.status()} {exc.message()}"


def streamed(url: str, model: str) -> str:
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(model, [x_input()])
        result, error = answers.get(timeout=30)
    finally:
        client.stop_stream()
    return f"refused: {error}" if error else f"answered {result.as_numpy('Y').tolist()}"


def parallel_s(call, url: str, model: str) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(PARALLEL) as pool:
        answers = list(pool.map(lambda _: call(url, model), range(PARALLEL)))
    if not all(answer.startswith("answered") for answer in answers):
        raise SystemExit(f"{model}: {answers}")
    return round(time.perf_counter() - started, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        root = Path(work) / "repository"
        write_repository(root)
        with local_server(load_settings(), root, Path(work)) as server:
            url = server.grpc_url
            result = {
                **record.header("execute_overlap", None),
                "tritonserver": "2.51 (nvidia-pytriton 0.7.0), Python backend",
                "hold_s": HOLD_S,
                "parallel": PARALLEL,
                "decoupled_unary": unary(url, "decoupled"),
                "decoupled_stream": streamed(url, "decoupled"),
                "decoupled_ensemble_unary": unary(url, "decoupled_ensemble"),
                "async_execute_unary_parallel_s": parallel_s(unary, url, "async_execute"),
                "async_decoupled_stream_parallel_s": parallel_s(streamed, url, "async_decoupled"),
            }
    for key, value in result.items():
        print(f"{key}: {value}")
    args.out.mkdir(parents=True, exist_ok=True)
    record.write(args.out, result)


if __name__ == "__main__":
    main()
