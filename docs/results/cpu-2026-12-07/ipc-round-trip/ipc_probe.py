"""Round trip of one engine submission between two processes on this machine: a stub's packed ids out (one text:
64 int32), an embedding back (768 fp16), over a Unix socketpair with raw bytes, and over shared memory with a
socketpair byte as the doorbell. p50/p99 of N round trips, one at a time (c=1), after a warm-up."""
import os, socket, sys, time, mmap
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
        b = sock.recv(1)
        if not b:
            return
        _ = bytes(shm[:IDS])          # read the request
        shm[IDS:IDS + OUT] = b"\x01" * OUT  # write the answer
        sock.send(b"\x00")

def timed(fn):
    for _ in range(1000):
        fn()
    t = []
    for _ in range(N):
        s = time.perf_counter_ns(); fn(); t.append(time.perf_counter_ns() - s)
    t = np.array(t) / 1000
    return round(float(np.percentile(t, 50)), 1), round(float(np.percentile(t, 99)), 1)

ids = np.arange(64, dtype=np.int32).tobytes()
a, b = socket.socketpair()
if os.fork() == 0:
    a.close(); serve_socket(b); os._exit(0)
b.close()
def rt_socket():
    a.sendall(ids); got = a.recv(65536)
    while len(got) < OUT: got += a.recv(65536)
print("socketpair bytes, us p50/p99:", timed(rt_socket))
a.close(); os.wait()

shm = mmap.mmap(-1, IDS + OUT)
a, b = socket.socketpair()
if os.fork() == 0:
    a.close(); serve_shm(b, shm); os._exit(0)
b.close()
def rt_shm():
    shm[:IDS] = ids; a.send(b"\x00"); a.recv(1); np.frombuffer(shm, np.float16, 768, IDS).copy()
print("shared memory + doorbell, us p50/p99:", timed(rt_shm))
a.close(); os.wait()
