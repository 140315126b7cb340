"""A stand-in for the GPU side of the sandbox (``mirage.sass.worker.serve``), for CPU tests of the
process control: candidates whose bytes start with a marker hang, crash, or compute wrong results."""

from __future__ import annotations

import os
import time


def serve(connection) -> None:
    while True:
        try:
            kind, payload = connection.recv()
        except EOFError:
            return
        if kind == "stop":
            return
        if kind == "setup":
            connection.send({"status": "ok", "original_us": 10.0, "launches_per_round": 30,
                             "unwritten_outputs": 0})
            continue
        data = payload["cubin"]
        if data.startswith(b"HANG"):
            time.sleep(3600)
        if data.startswith(b"CRASH"):
            os._exit(17)
        if data.startswith(b"WRONG"):
            connection.send({"status": "wrong-output", "detail": "output out differs in 12 bytes (set 0)"})
        elif data.startswith(b"ERROR"):
            connection.send({"status": "error", "detail": "CUDADriverError: CUDA_ERROR_ILLEGAL_ADDRESS"})
        elif kind == "verify":
            connection.send({"status": "ok", "sets": len(payload["seeds"])})
        else:
            faster = 0.9 if data.startswith(b"FAST") else 1.0
            connection.send({"status": "ok", "original_us": [10.0, 10.2, 9.9],
                             "candidate_us": [10.0 * faster, 10.1 * faster, 9.8 * faster]})
