"""What the server benchmarks under bench/ share: waiting for `specdec serve`, stopping it."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request


def wait_ready(port: int, deadline_s: float = 900) -> None:
    """Until http://127.0.0.1:PORT/health answers (loading the pair can take minutes)."""
    deadline = time.time() + deadline_s
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return
        except Exception:
            if time.time() > deadline:
                raise
            time.sleep(1)


def stop(server: subprocess.Popen) -> None:
    """SIGTERM, then a kill if it has not ended within a minute."""
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
