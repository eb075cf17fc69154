"""What waiting for a future costs in asyncio, three ways: a plain await, asyncio.wait_for with a 60 s timeout (the
Coalescer before this change), and a loop timer cancelled after the answer (after it). Each future is answered by
the loop at once, as a Triton call's answer is. Prints microseconds per wait, twice each in turn."""

import asyncio
import time

WAITS = 200_000


def expire(future: asyncio.Future) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


async def main() -> None:
    loop = asyncio.get_running_loop()

    def answered() -> asyncio.Future:
        future = loop.create_future()
        loop.call_soon(future.set_result, 1)
        return future

    async def plain():
        return await answered()

    async def wait_for():
        return await asyncio.wait_for(answered(), 60)

    async def timer():
        future = answered()
        handle = loop.call_later(60, expire, future)
        try:
            return await future
        finally:
            handle.cancel()

    for wait in (plain, wait_for, timer) * 2:
        started = time.perf_counter()
        for _ in range(WAITS):
            await wait()
        print(f"{wait.__name__}: {(time.perf_counter() - started) / WAITS * 1e6:.2f} us")


asyncio.run(main())
