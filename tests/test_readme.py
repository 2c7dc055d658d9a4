"""The README's code blocks run as pasted: each Python block in a fresh process, on a
default store of its own (``GRABEN_HOME``), twice (a reader tries a snippet again)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_the_readme_has_a_python_block_per_door() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("code", BLOCKS, ids=[b.splitlines()[-1][:40] for b in BLOCKS])
def test_a_readme_block_runs_as_pasted(code: str, tmp_path: Path) -> None:
    env = {**os.environ, "GRABEN_HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path)}
    env.pop("GRABEN_URL", None)
    for _ in range(2):
        ran = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert ran.returncode == 0, ran.stderr[-3000:]
