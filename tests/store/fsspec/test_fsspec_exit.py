"""pandas and pyarrow through ``graben://``: the interpreter exits cleanly after them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).with_name("pandas_exit.py")
RUNS = 3
"""Runs per store in ``make test``; the issue's check, 100, is ``pytest -m huge``."""


def _run(base: str, step: str, env: dict[str, str]) -> tuple[int | str, float]:
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), base, step],
            check=False,
            env=env,
            capture_output=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        return "hung", time.monotonic() - started
    code: int | str = done.returncode
    if code != 0 or done.stdout.strip() != b"ok":
        code = f"{done.returncode}: {done.stderr.decode()[-400:]}"
    return code, time.monotonic() - started


@pytest.mark.slow
@pytest.mark.parametrize("store", ["embedded", "cluster"])
def test_readme_example_exits_cleanly_every_time(
    store: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    _check_exits(store, request, tmp_path, RUNS)


@pytest.mark.huge
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("store", ["embedded", "cluster"])
def test_readme_example_exits_cleanly_a_hundred_times(
    store: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The issue's bar (about two minutes per store)."""
    _check_exits(store, request, tmp_path, int(os.environ.get("GRABEN_EXIT_RUNS", "100")))


def _check_exits(store: str, request: pytest.FixtureRequest, tmp_path: Path, runs: int) -> None:
    env = dict(os.environ)
    env.pop("GRABEN_URL", None)
    env["GRABEN_HOME"] = str(tmp_path / "home")
    name = f"exit-{uuid.uuid4().hex[:8]}"
    base = (
        f"graben:///{name}"
        if store == "embedded"
        else f"{request.getfixturevalue('cluster_url')}/{name}"
    )
    assert _run(base, "write", env)[0] == 0
    results = [_run(base, "read", env) for _ in range(runs)]
    assert [code for code, _ in results] == [0] * runs  # not 134 (SIGABRT) nor hung
    assert max(seconds for _, seconds in results) < 10
