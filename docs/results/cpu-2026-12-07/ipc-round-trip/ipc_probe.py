"""Round trip of one engine submission between two processes on this machine: a stub's packed ids out (one text:
64 int32), an embedding back (768 fp16), over a Unix socketpair with raw bytes, and over shared memory with a
socketpair byte as the doorbell. p50/p99 of N round trips, one at a time (c=1), after a warm-up.
(As run on 2026-12-07, laid out for the linter afterwards.)"""

import mmap
import os
import socket
import time

import numpy as np

N = 20000
IDS, OUT = 64 * 4, 768 * 2


def serve_socket(sock):
    out = bytes(OUT)
    while True:
        data = sock.recv(65536)
        if not data:
            return
        sock.sendall(out)


def serve_shm(sock, shm):
    while True:
        if not sock.recv(1):
            return
        _ = bytes(shm[:IDS])  # read the request
        shm[IDS : IDS + OUT] = b"\x01" * OUT  # write the answer
        sock.send(b"\x00")


def timed(fn):
    for _ in range(1000):
        fn()
    spans = []
    for _ in range(N):
        start = time.perf_counter_ns()
        fn()
        spans.append(time.perf_counter_ns() - start)
    spans = np.array(spans) / 1000
    return round(float(np.percentile(spans, 50)), 1), round(float(np.percentile(spans, 99)), 1)


def main():
    ids = np.arange(64, dtype=np.int32).tobytes()
    a, b = socket.socketpair()
    if os.fork() == 0:
        a.close()
        serve_socket(b)
        os._exit(0)
    b.close()

    def round_trip_socket():
        a.sendall(ids)
        got = a.recv(65536)
        while len(got) < OUT:
            got += a.recv(65536)

    print("socketpair bytes, us p50/p99:", timed(round_trip_socket))
    a.close()
    os.wait()

    shm = mmap.mmap(-1, IDS + OUT)
    a, b = socket.socketpair()
    if os.fork() == 0:
        a.close()
        serve_shm(b, shm)
        os._exit(0)
    b.close()

    def round_trip_shm():
        shm[:IDS] = ids
        a.send(b"\x00")
        a.recv(1)
        np.frombuffer(shm, np.float16, 768, IDS).copy()

    print("shared memory + doorbell, us p50/p99:", timed(round_trip_shm))
    a.close()
    os.wait()


if __name__ == "__main__":
    main()
