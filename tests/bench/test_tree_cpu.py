"""``tree_cpu``: the CPU a bench's whole process tree used, children included."""

from __future__ import annotations

import subprocess
import sys

from graben.bench._ranks import tree_cpu


def test_a_busy_child_counts_and_an_idle_one_does_not() -> None:
    burn = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\n"
    busy = subprocess.Popen(
        [sys.executable, "-c", burn + "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    idle = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        before = tree_cpu(idle.pid)
        start = tree_cpu()
        while tree_cpu(busy.pid) < 0.45:  # the child burns its half second
            pass
        assert tree_cpu() - start >= 0.3  # counted in this process's tree
        assert tree_cpu(idle.pid) - before < 0.1
    finally:
        for proc in (busy, idle):
            proc.kill()
            proc.wait()
            assert proc.stdin is not None
            proc.stdin.close()
