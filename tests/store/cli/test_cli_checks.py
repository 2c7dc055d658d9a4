"""The store's ``graben`` subcommands, checked the way a user would check them: fsck,
which store a command uses, progress, and the installed script.

Most tests run the real ``graben.store.cli.main(argv)`` in-process on a
fresh embedded store under ``tmp_path``; the last ones run the installed
``graben`` script as a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_kit import Graben, MiB, chunk_files, failed, flip_byte, run_script, write

from graben.store.cli import _main, _render

# --- fsck -----------------------------------------------------------------------------


def test_fsck_passes_a_clean_store(graben: Graben) -> None:
    graben("put", "-", "/a", stdin=b"a" * 10_000)
    result = graben("fsck")
    assert result.code == 0
    assert result.text.startswith("checked 1 chunks")
    assert "OK: no problems" in result.text


def test_fsck_finds_a_corrupt_chunk_and_exits_1(graben: Graben, tmp_path: Path) -> None:
    graben("put", "-", "/keep", stdin=b"k" * 10_000)
    graben("put", str(write(tmp_path / "w", os.urandom(100_000))), "/ckpt/w")
    (bad,) = [p for p in chunk_files(graben.store) if p.stat().st_size == 100_000]
    flip_byte(bad, 500)

    result = graben("fsck")
    assert result.code == 1
    assert f"corrupt  {bad.name}" in result.text
    assert "files /ckpt/w" in result.text
    assert str(bad) in result.text
    assert "DAMAGED: 1 corrupt" in result.text

    report = graben("fsck", "--json")
    assert report.code == 1
    data = report.json()
    assert data["ok"] is False
    assert [(p["kind"], p["chunk"], p["paths"]) for p in data["problems"]] == [
        ("corrupt", bad.name, ["/ckpt/w"])
    ]


def test_fsck_shows_an_odd_file_name_on_one_line(graben: Graben) -> None:
    graben("put", "-", "/ckpt/w\nx", stdin=b"w" * 100_000)  # past --inline-max: on a node
    (chunk,) = chunk_files(graben.store)
    flip_byte(chunk, 5)

    result = graben("fsck")
    assert result.code == 1
    assert "    files '/ckpt/w'$'\\n''x'\n" in result.text
    assert len(result.text.splitlines()) == 6  # checked, corrupt, at, files, why, verdict


def test_fsck_finds_a_missing_chunk(graben: Graben) -> None:
    graben("put", "-", "/gone", stdin=b"g" * 100_000)
    (chunk,) = chunk_files(graben.store)
    chunk.unlink()

    result = graben("fsck", "--json")
    assert result.code == 1
    assert [p["kind"] for p in result.json()["problems"]] == ["missing"]


def test_fsck_counts_orphans_lists_them_verbose_passes_and_collects_them(graben: Graben) -> None:
    graben("put", "-", "/a", stdin=b"a")
    orphan_id = "ab" * 32
    orphan = write(graben.store / "chunks" / "ab" / "ab" / orphan_id, b"stray")

    result = graben("fsck")
    assert result.code == 0
    assert "1 orphan: chunk files no metadata names" in result.text
    assert orphan_id not in result.text
    assert f"orphan   {orphan_id}" in graben("fsck", "--verbose").text

    old = time.time() - 10 * 86400  # older than the collection grace period
    os.utime(orphan, (old, old))
    collected = graben("fsck", "--collect", "--json")
    assert collected.code == 0
    assert collected.json()["collected"] == 1
    assert not orphan.exists()


# --- which store ----------------------------------------------------------------------


def test_store_defaults_to_graben_url(graben: Graben, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRABEN_URL", str(graben.store))
    assert graben("put", "-", "/env", stdin=b"e", store=False).code == 0
    assert graben("cat", "/env").out == b"e"  # the same store, named by --store


def test_store_defaults_to_graben_home(graben: Graben, tmp_path: Path) -> None:
    assert graben("put", "-", "/h", stdin=b"h", store=False).code == 0
    assert (tmp_path / "home" / "meta.db").exists()
    assert graben("cat", "/h", store=False).out == b"h"


def test_paths_may_be_urls(graben: Graben) -> None:
    graben("put", "-", "/u/f", stdin=b"u")
    assert graben("cat", "graben:///u/f").out == b"u"
    assert graben("ls", "graben:///u").text == "f\n"


def test_a_path_url_naming_another_store_conflicts(graben: Graben) -> None:
    graben("mkdir", "/d")
    failed(graben("ls", "graben://127.0.0.1:9/d"), "graben://127.0.0.1:9", str(graben.store))
    failed(
        graben("mv", "graben://127.0.0.1:9/a", "graben://127.0.0.1:8/b", store=False),
        "graben://127.0.0.1:8",
    )


def test_reading_commands_do_not_create_a_store(graben: Graben, tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    reads = (["ls", "/"], ["stat", "/x"], ["du"], ["fsck"], ["cat", "/x"], ["rm", "/x"])
    for argv in (*reads, ["status"], ["status", "--json"]):
        failed(graben(argv[0], "--store", str(missing), *argv[1:], store=False), "no store")
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()  # an empty directory is no store either
    failed(graben("status", "--store", str(empty), store=False), "no store")
    assert list(empty.iterdir()) == []
    assert graben("mkdir", "--store", str(missing), "/d", store=False).code == 0  # writes make it
    assert graben("status", "--store", str(missing), store=False).code == 0


# --- progress -------------------------------------------------------------------------


@pytest.mark.usefixtures("terminal")
def test_large_transfers_show_progress_on_a_terminal(graben: Graben, tmp_path: Path) -> None:
    src = write(tmp_path / "big.bin", os.urandom(3 * MiB))
    result = graben("put", str(src), "/big.bin")
    assert result.code == 0
    assert "big.bin" in result.err
    assert "MiB" in result.err

    small = graben("put", "-", "/small", stdin=b"s" * 1000)
    assert small.err == ""


@pytest.mark.usefixtures("terminal")
def test_json_output_never_has_progress(graben: Graben) -> None:
    graben("put", "-", "/big", stdin=os.urandom(3 * MiB))
    result = graben("fsck", "--json")
    assert result.code == 0
    assert result.err == ""
    assert result.json()["ok"] is True


def test_no_progress_when_stderr_is_not_a_terminal(
    graben: Graben, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_render, "LARGE", MiB)
    assert graben("put", "-", "/big", stdin=os.urandom(3 * MiB)).err == ""


def test_meter_with_unknown_total_starts_once_the_work_is_large(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_render, "LARGE", 100)
    shown = []
    with _render.Meter("x", None, enabled=True) as meter:
        for nbytes in (100, 1):
            meter(nbytes)
            shown.append(meter.shown)
    with _render.Meter("x", None, enabled=False) as off:
        off(1000)
        shown.append(off.shown)
    assert shown == [False, True, False]


# --- the installed script -------------------------------------------------------------


def test_installed_script_round_trips_and_reports_errors(store: Path) -> None:
    data = os.urandom(100_000)
    put = run_script("put", "--store", str(store), "-", "/s/f", stdin=data)
    assert put.returncode == 0, put.stderr.decode()

    assert run_script("cat", "--store", str(store), "/s/f").stdout == data
    listing = run_script("ls", "--store", str(store), "--json", "/s")
    assert [e["path"] for e in json.loads(listing.stdout)] == ["/s/f"]

    missing = run_script("stat", "--store", str(store), "/s/nope")
    assert missing.returncode == 1
    assert missing.stdout == b""
    assert missing.stderr.decode().startswith("graben: ")
    assert b"Traceback" not in missing.stderr


def test_installed_script_stops_quietly_when_the_reader_goes_away(store: Path) -> None:
    put = run_script("put", "--store", str(store), "-", "/big", stdin=os.urandom(4 * MiB))
    assert put.returncode == 0, put.stderr.decode()
    script = Path(sys.executable).parent / "graben"
    with subprocess.Popen(
        [str(script), "cat", "--store", str(store), "/big"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert len(proc.stdout.read(10)) == 10
        proc.stdout.close()  # like `graben cat /big | head -c 10`
        err = proc.stderr.read()
        assert proc.wait(timeout=30) == 0
    assert err == b""


@pytest.mark.parametrize(
    ("argv", "meant"),
    [
        (["lss"], "ls"),
        (["tenant", "ad", "x"], "add"),
        (["fskc"], "fsck"),
    ],
)
def test_a_mistyped_command_is_told_the_closest_one(
    graben: Graben, argv: list[str], meant: str
) -> None:
    result = graben(*argv, store=False)
    assert result.code == 2 and result.out == b""
    assert f"did you mean '{meant}'?" in result.err, result.err


def test_nothing_close_suggests_nothing(graben: Graben) -> None:
    result = graben("zzzzzz", store=False)
    assert result.code == 2 and "invalid choice" in result.err and "did you mean" not in result.err


def test_counts_are_written_as_people_write_them() -> None:
    """``--files 10M`` (the README's tenant block) is ten million files, as sizes are."""
    import argparse

    from graben.store.cli._listen import count_arg

    for text, count in (("10000000", 10**7), ("10M", 10**7), ("10_000", 10**4), ("1.5k", 1500)):
        assert count_arg(text) == count, text
    for bad in ("10MiB", "-1", "1.5", "ten", "", "1e3"):
        with pytest.raises(argparse.ArgumentTypeError, match="not a count"):
            count_arg(bad)
    parser = _main.build_parser("tenant")
    args = parser.parse_args(["tenant", "add", "a", "--root", "/teams/a", "--files", "10M"])
    assert args.files == 10**7


def test_a_required_flags_help_shows_no_default(graben: Graben) -> None:
    result = graben("agent", "serve", "--help", store=False)
    assert result.code == 0
    text = " ".join(result.text.split())
    assert "most bytes of segments held, e.g. 8G (required)" in text and "(8G)" not in text


def test_du_h_is_human_sizes_as_unix_du_s(graben: Graben, tmp_path: Path) -> None:
    """``du -h`` gives sizes in KiB, MiB... (as every Unix ``du``), not the help; ``--help``
    still helps, and ``-H`` still works. Sizes are human by default; ``-b``: bytes."""
    assert graben("put", str(write(tmp_path / "f", b"x" * (2 * MiB))), "/f").code == 0
    for flag in ("-h", "-H"):
        result = graben("du", flag, "/")
        assert result.code == 0 and "usage" not in result.text, result
        assert "2.0 MiB" in result.text or "2 MiB" in result.text, result.text
    assert "2.0 MiB" in graben("du", "/").text  # human sizes are the default
    assert str(2 * MiB) in graben("du", "-b", "/").text  # exact bytes when asked
    helped = graben("du", "--help", store=False)
    assert helped.code == 0 and "usage: graben du" in helped.text
