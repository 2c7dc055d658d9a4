"""What the bench's test files share."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from graben.store.cli._main import main


def quiet_run(tmp_path: Path, *args: str) -> list[dict[str, Any]]:
    """``graben bench *args`` in ``tmp_path / "scratch"``, its table swallowed; its JSON rows."""
    out = tmp_path / "r.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stdout", io.StringIO())
        assert main(["bench", *args, "--dir", str(tmp_path / "scratch"), "--json", str(out)]) == 0
    rows: list[dict[str, Any]] = json.loads(out.read_text())["results"]
    return rows
