"""A TCP port for a test's torch.distributed ranks (MASTER_PORT), safe under pytest-xdist.

``bind(0)`` then close, the usual trick, hands out a port from the kernel's ephemeral range, which
the kernel may give again to the next ``bind(0)`` or outgoing connection (another xdist worker's
ranks, or the gloo connections themselves) before the ranks bind it. :func:`free_port` instead
takes a port below the ephemeral range (Linux: 32768-60999), from a block of its own per xdist
worker (``PYTEST_XDIST_WORKER`` gw0, gw1, ...), that nothing is listening on: two workers never pick
the same port, and the kernel never hands it out by itself.
"""

from __future__ import annotations

import os
import random
import socket

BASE, BLOCK = 20000, 1000


def free_port() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    lo = BASE + BLOCK * (index % 12)  # 20000-31999: below the ephemeral range
    for port in random.Random(os.getpid()).sample(range(lo, lo + BLOCK), 50):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port in {lo}-{lo + BLOCK - 1}")
