"""Metadata services of adjacent versions on one engine: a newer graben will not migrate
the schema under a service that still beats, and a service whose schema changed under
it stops with a message that says so, rather than fail statement by statement.

The older service is a row in ``services`` as a graben of schema 16 leaves it, heard
from just now, on an engine taken back to 16 (running the old code itself would take a
checkout of it); the services that stop are real ``graben meta serve`` processes whose
engine a newer graben has migrated (its recorded version moved past theirs). Every test
runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pg_kit import MIGRATIONS, Engine

from graben.store import GrabenError
from graben.store._types import ServiceState
from graben.store.local import make_secret_file
from graben.store.meta import SCHEMA_VERSION
from graben.store.meta._leader import Leadership, SchemaChanged

OLD = "the-old-one"


def back_to_16_with_a_live_service(engine: Engine, last_seen: float) -> None:
    """The engine as a service of schema 16 serving it leaves it: its row, no version."""
    engine.open()
    engine.sql("ALTER TABLE services DROP COLUMN schema_version")
    engine.sql("ALTER TABLE services DROP COLUMN metrics")  # schema 18's
    engine.sql("ALTER TABLE nodes DROP COLUMN metrics")
    engine.set_version(16)
    engine.sql(
        "INSERT INTO services (id, address, engine, started, last_seen) "
        "VALUES (%s, %s, %s, %s, %s)",
        OLD,
        "10.0.0.7:7100",
        engine.name,
        last_seen - 60,
        last_seen,
    )


def test_a_newer_graben_will_not_migrate_under_a_live_service(engine: Engine) -> None:
    back_to_16_with_a_live_service(engine, time.time())
    with pytest.raises(GrabenError) as refused:
        engine.open(create=False)
    said = refused.value.message
    assert f"metadata service {OLD} at 10.0.0.7:7100 (schema version 16) still runs" in said
    assert f"from version 16 to {MIGRATIONS}" in said and "stop it first" in said
    assert engine.version() == 16  # nothing migrated
    engine.sql("UPDATE services SET last_seen = last_seen - 10")  # killed: gone after 5 s
    engine.open(create=False)
    assert engine.version() == MIGRATIONS


def test_a_service_stops_leading_once_its_schema_changed_under_it(engine: Engine) -> None:
    me = ServiceState("svc", "127.0.0.1:7100", engine.name, 0.0, 0.0, SCHEMA_VERSION)
    leadership = Leadership(engine.open(), me)

    async def run() -> SchemaChanged:
        await leadership.beat()
        assert leadership.leading
        engine.set_version(MIGRATIONS + 1)  # what a newer graben's migration leaves
        await leadership.beat()
        assert not leadership.leading
        try:
            return await asyncio.wait_for(leadership.until_outdated(), 1.0)
        finally:
            await leadership.close()

    why = asyncio.run(run()).message
    assert f"schema is now version {MIGRATIONS + 1}, not the {MIGRATIONS}" in why
    assert "svc at 127.0.0.1:7100" in why and "this service stops" in why


# -- real services --------------------------------------------------------------------------


@pytest.fixture(name="serve")
def serve_fixture(engine: Engine, tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """``graben meta serve`` on the test's engine: start one with ``serve.append(...)``
    of ``meta_serve``; each is stopped after the test (by its pid)."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
        proc.communicate(timeout=30)


def meta_serve(engine: Engine, secret: Path, *extra: str) -> subprocess.Popen[str]:
    url = f"sqlite:///{engine.location}" if engine.name == "sqlite" else engine.location
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "graben.store.cli", "meta", "serve", "--engine", url),
            *("--listen", "127.0.0.1:0", "--secret-file", str(secret), *extra),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def listening(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.startswith("listening on 127.0.0.1:"), (line, proc.stderr and proc.stderr.read())
    return line


def test_a_newer_service_refuses_to_start_beside_an_older_one(
    engine: Engine, serve: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    back_to_16_with_a_live_service(engine, time.time() + 3)  # still live in 8 s
    secret = make_secret_file(tmp_path / "secret")
    serve.append(meta_serve(engine, secret))
    _, err = serve[-1].communicate(timeout=60)
    assert serve[-1].returncode != 0
    assert f"metadata service {OLD} at 10.0.0.7:7100 (schema version 16) still runs" in err
    assert "stop it first (or stop every service and upgrade them together)" in err
    assert "Traceback" not in err and engine.version() == 16


def test_services_of_one_version_share_an_engine_and_stop_when_it_is_migrated(
    engine: Engine, serve: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    secret = make_secret_file(tmp_path / "secret")
    serve.append(meta_serve(engine, secret, "--init"))
    listening(serve[0])
    serve.append(meta_serve(engine, secret))  # same version: no migration, no refusal
    listening(serve[1])
    assert serve[0].poll() is None
    engine.set_version(MIGRATIONS + 1)
    for proc in serve:
        _, err = proc.communicate(timeout=30)  # a beat a second finds it
        assert proc.returncode != 0, err
        assert f"the engine's schema is now version {MIGRATIONS + 1}" in err
        assert "this service stops (upgrade it, then start it again)" in err
        assert "Traceback" not in err
