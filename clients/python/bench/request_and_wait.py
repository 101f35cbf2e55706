"""Round trips per second of the Python client's request_and_wait against the real server,
beside raw grpcio RequestApproval calls measured in the same run.

    python clients/python/bench/request_and_wait.py [--duration 5] [--threads 4]
        [--binary target/release/countersign-server]

A policy allow rule resolves every request at once, so each request_and_wait is one
RequestApproval round trip plus the client's work (building the request, converting the answer
to dataclasses, deciding there is nothing to wait for). The raw figure sends prebuilt protobuf
messages through the generated stub: the ceiling for a Python caller. Never asserts times.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import grpc  # noqa: E402
from conftest import REPO, Server, render  # noqa: E402

from countersign import Client  # noqa: E402
from countersign.v1 import approval_pb2 as pb  # noqa: E402
from countersign.v1 import approval_pb2_grpc as pb_grpc  # noqa: E402

ALLOW_BENCH = """
[[rules]]
name = "bench-allow"
action = "allow"
[rules.match]
tool = "bench"
"""
SETTINGS = {
    # Rate and pending limits off: the bench measures the round trip, not the limiter.
    "limits": {"requests_per_minute": 0, "max_pending_per_agent": 0},
    "storage": {"durability": "normal"},
}


def measure(threads: int, duration: float, call: Callable[[int], None]) -> tuple[float, list[float]]:
    """Closed loops on ``threads`` threads for ``duration`` seconds: (calls/s, latencies)."""
    keys = itertools.count()
    stop = time.monotonic() + duration
    latencies: list[list[float]] = [[] for _ in range(threads)]

    def loop(mine: list[float]) -> None:
        while time.monotonic() < stop:
            started = time.perf_counter()
            call(next(keys))
            mine.append(time.perf_counter() - started)

    workers = [threading.Thread(target=loop, args=(mine,)) for mine in latencies]
    began = time.monotonic()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    merged = sorted(x for mine in latencies for x in mine)
    return len(merged) / (time.monotonic() - began), merged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per figure (5)")
    parser.add_argument("--threads", type=int, default=4, help="concurrent callers (4)")
    parser.add_argument(
        "--binary", type=Path, help="countersign-server (default: target/release, else debug)"
    )
    args = parser.parse_args()
    binary = args.binary or next(
        (
            p
            for p in (REPO / "target/release/countersign-server", REPO / "target/debug/countersign-server")
            if p.exists()
        ),
        None,
    )
    if binary is None:
        parser.error("no countersign-server binary: run cargo build --release -p countersign-server")

    with tempfile.TemporaryDirectory() as workdir:
        server = Server(binary, Path(workdir), render(SETTINGS) + ALLOW_BENCH, {})
        try:
            channel = grpc.insecure_channel(server.address)
            stub = pb_grpc.ApprovalServiceStub(channel)
            client = Client(server.address)

            def raw(key: int) -> None:
                request = pb.RequestApprovalRequest(
                    agent_id="bench-raw",
                    tool_name="bench",
                    idempotency_key=f"raw-{key}",
                    arguments_json="{}",
                    risk=pb.RISK_MEDIUM,
                )
                response = stub.RequestApproval(request, timeout=10)
                assert response.approval.state == pb.APPROVAL_STATE_APPROVED

            def sdk(key: int) -> None:
                approval = client.request_and_wait(
                    agent_id="bench-sdk", tool_name="bench", idempotency_key=f"sdk-{key}", deadline=10
                )
                assert approval.approved

            for call in (raw, sdk):  # warm-up: connections, caches
                measure(args.threads, 0.5, call)
            rows = [
                ("raw grpcio RequestApproval (baseline)", *measure(args.threads, args.duration, raw)),
                ("Client.request_and_wait, policy allow", *measure(args.threads, args.duration, sdk)),
            ]
        finally:
            server.kill()

    print(f"binary {binary}, {args.threads} threads, {args.duration:.0f} s per figure, durability normal")
    print(f"{'figure':<42}{'calls/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'vs baseline':>13}")
    print("-" * 83)
    baseline = rows[0][1]
    for name, rate, latencies in rows:
        p50 = statistics.median(latencies) * 1000
        p99 = latencies[int(len(latencies) * 0.99)] * 1000
        ratio = "-" if name.startswith("raw") else f"{rate / baseline:.2f}x"
        print(f"{name:<42}{rate:>10,.0f}{p50:>9.2f}{p99:>9.2f}{ratio:>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
