"""The bytes a GPU run copies to the host, counted from the CUDA profiler's device-to-host memcpy records (issue 46:
no output copies more than its own bytes off the GPU)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

SLACK_BYTES = 64  # a few scalars read back (a nonzero count, say), never a row


def device_to_host_bytes(run):
    """run()'s result, and the bytes its device-to-host copies moved (> 0: rows must leave, so a profile that saw no
    copy fails rather than passes)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as profiled:
        result = run()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.json"
        profiled.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    copied = sum(
        int(event.get("args", {}).get("bytes", 0))
        for event in events
        if event.get("cat") == "gpu_memcpy" and "DtoH" in event.get("name", "")
    )
    assert copied > 0, "the profile recorded no device-to-host copy"
    return result, copied


def own_bytes(*arrays) -> int:
    """The bytes of what an engine answers (None: an output not wanted)."""
    return sum(np.asarray(array).nbytes for array in arrays if array is not None)
