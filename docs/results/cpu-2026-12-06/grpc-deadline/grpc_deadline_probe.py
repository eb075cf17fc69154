"""How late grpc.aio reports DEADLINE_EXCEEDED: 1,000 calls with a 5 ms deadline, 64 at a time, to a grpc.aio server
that answers after 100 ms, against the same calls given up at 5 ms by the loop's own timer (asyncio.wait's timeout,
the call cancelled and not waited for); each with the loop idle and with a 0.5 ms CPU task every 1 ms beside it.

    python docs/results/cpu-2026-12-06/grpc-deadline/grpc_deadline_probe.py grpc|timer [busy]
"""

import asyncio
import sys
import time

import grpc

CALLS, AT_ONCE, DEADLINE_S = 1000, 64, 0.005


async def serve() -> tuple[grpc.aio.Server, int]:
    async def slow(request, context):
        await asyncio.sleep(0.1)
        return b"x"

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler("p.S", {"M": grpc.unary_unary_rpc_method_handler(slow)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def main(kind: str, busy: bool) -> None:
    server, port = await serve()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary("/p.S/M")
    stop = asyncio.Event()

    async def burn() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            while time.perf_counter() - started < 0.0005:
                pass
            await asyncio.sleep(0.001)

    async def by_grpc() -> None:
        try:
            await call(b"", timeout=DEADLINE_S)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    async def by_timer() -> None:  # as serving/api/coalescer.py's _within: no wait for the cancellation to end
        task = asyncio.ensure_future(call(b"", timeout=1.0))
        done, _ = await asyncio.wait((task,), timeout=DEADLINE_S)
        if not done:
            task.cancel()

    async def timed() -> float:
        started = time.perf_counter()
        await (by_grpc() if kind == "grpc" else by_timer())
        return (time.perf_counter() - started) * 1000

    burner = asyncio.create_task(burn()) if busy else None
    late: list[float] = []
    for start in range(0, CALLS, AT_ONCE):
        late += await asyncio.gather(*(timed() for _ in range(min(AT_ONCE, CALLS - start))))
    stop.set()
    if burner is not None:
        await burner
    late.sort()
    within = sum(ms <= 15 for ms in late)
    print(f"{kind} {'busy' if busy else 'idle'}: p50 {late[500]:.2f} p99 {late[990]:.2f} max {late[-1]:.2f} ms, "
          f"within 15 ms: {within}")  # fmt: skip
    await channel.close()
    await server.stop(None)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], len(sys.argv) > 2))
