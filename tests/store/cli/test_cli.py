"""The store's ``graben`` subcommands, checked the way a user would check them: the
commands that move and name files (put, get, cat, ls, stat, du, mkdir, rm, mv).

The tests run the real ``graben.store.cli.main(argv)`` in-process on a fresh
embedded store under ``tmp_path`` (``cli_kit.Graben``; fixtures in
``conftest.py``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_kit import COMMANDS, Graben, MiB, Result, chunk_files, failed, flip_byte, write

from graben.store.cli._main import build_parser

# --- help ---------------------------------------------------------------------------


def test_top_level_help_lists_every_store_command(graben: Graben) -> None:
    result = graben("--help", store=False)
    assert result.code == 0
    listed = {line.split()[0] for line in result.text.splitlines() if line.startswith("    ")}
    assert set(COMMANDS) <= listed


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_store_option(graben: Graben, command: str) -> None:
    result = graben(command, "--help", store=False)
    assert result.code == 0
    assert result.text.startswith(f"usage: graben {command}")
    assert "--store URL" in result.text
    assert "$GRABEN_URL" in result.text


# --- put / get / cat ------------------------------------------------------------------


def test_multi_chunk_file_round_trips_through_put_and_get(graben: Graben, tmp_path: Path) -> None:
    data = os.urandom(20 * MiB + 123)  # three 8 MiB chunks, the last one partial
    src = write(tmp_path / "src" / "big.bin", data)

    assert graben("put", str(src), "/data/big.bin").code == 0
    assert len(chunk_files(graben.store)) == 3
    assert graben("get", "/data/big.bin", str(tmp_path / "copy.bin")).code == 0

    assert (tmp_path / "copy.bin").read_bytes() == data
    assert graben("cat", "/data/big.bin").out == data
    assert graben("stat", "/data/big.bin", "--json").json()["size"] == len(data)


def test_stdin_to_stdout_round_trip(graben: Graben) -> None:
    data = bytes(range(256)) * 1000 + b"\r\n\x00"

    assert graben("put", "-", "/p/raw", stdin=data).code == 0
    assert graben("get", "/p/raw", "-").out == data
    assert graben("cat", "/p/raw").out == data


def test_empty_file_round_trips(graben: Graben, tmp_path: Path) -> None:
    assert graben("put", str(write(tmp_path / "empty", b"")), "/empty").code == 0
    assert graben("get", "/empty", str(tmp_path / "back")).code == 0
    assert (tmp_path / "back").read_bytes() == b""


def test_put_into_a_directory_keeps_the_local_name(graben: Graben, tmp_path: Path) -> None:
    src = write(tmp_path / "notes.txt", b"n")
    assert graben("put", str(src), "/new/").code == 0  # trailing slash: a directory
    assert graben("mkdir", "/old").code == 0
    assert graben("put", str(src), "/old").code == 0  # an existing directory

    assert graben("cat", "/new/notes.txt").out == b"n"
    assert graben("cat", "/old/notes.txt").out == b"n"


def test_get_into_a_directory_keeps_the_remote_name(graben: Graben, tmp_path: Path) -> None:
    graben("put", "-", "/a/model.pt", stdin=b"weights")
    (tmp_path / "dl").mkdir()

    assert graben("get", "/a/model.pt", str(tmp_path / "dl")).code == 0
    assert (tmp_path / "dl" / "model.pt").read_bytes() == b"weights"


def test_put_exclusive_refuses_an_existing_path(graben: Graben, tmp_path: Path) -> None:
    src = write(tmp_path / "f", b"new")
    graben("put", "-", "/f", stdin=b"old")

    failed(graben("put", "--exclusive", str(src), "/f"), "exists", "/f")
    assert graben("cat", "/f").out == b"old"
    assert graben("put", "--exclusive", str(src), "/g").code == 0
    assert graben("cat", "/g").out == b"new"


def test_put_recursive_uploads_a_tree(graben: Graben, tmp_path: Path) -> None:
    tree = tmp_path / "ckpt"
    write(tree / "meta.json", b"{}")
    write(tree / "shards" / "0.bin", b"zero")
    write(tree / "shards" / "1.bin", b"one")
    (tree / "empty").mkdir()

    failed(graben("put", str(tree), "/runs/"), "is a directory", "-r")
    assert graben("put", "-r", str(tree), "/runs/").code == 0

    assert graben("cat", "/runs/ckpt/shards/1.bin").out == b"one"
    assert graben("cat", "/runs/ckpt/meta.json").out == b"{}"
    names = [e["path"] for e in graben("ls", "/runs/ckpt", "--json").json()]
    assert names == ["/runs/ckpt/empty", "/runs/ckpt/meta.json", "/runs/ckpt/shards"]
    assert graben("du", "/runs", "--json").json()["files"] == 3


def test_put_of_a_missing_local_file_fails_cleanly(graben: Graben, tmp_path: Path) -> None:
    failed(graben("put", str(tmp_path / "nope"), "/x"), "No such file", "nope")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("put", "{local}", "s3://bucket/x"), ("'s3://bucket/x'", "not in a graben store")),
        (("ls", "http://host/runs"), ("'http://host/runs'", "not in a graben store")),
        (("ls", "graben:/runs"), ("not a graben URL", "graben:///path")),
    ],
)
def test_another_scheme_is_refused_not_taken_for_a_path(
    graben: Graben,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
    words: tuple[str, ...],
) -> None:
    """``graben put model.pt s3://bucket/x`` wrote /s3:/bucket/x into a new default store."""
    home = tmp_path / "home"
    monkeypatch.setenv("GRABEN_HOME", str(home))
    local = str(write(tmp_path / "model.pt", b"weights"))
    result = graben(*(a.format(local=local) for a in args), store=False)
    failed(result, *words)
    assert len(result.err.strip().splitlines()) == 1
    assert not home.exists()


def test_no_flag_is_taken_from_an_abbreviation(graben: Graben) -> None:
    """``--node 3`` ran as ``--nodes 3``: every command's flags are whole or refused."""
    refused = graben("ls", "--jso", "/")
    assert refused.code == 2 and "unrecognized arguments: --jso" in refused.err

    def parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from parsers(sub)

    every = list(parsers(build_parser()))
    assert len(every) >= 15 and not any(p.allow_abbrev for p in every)


def test_failed_get_leaves_the_old_local_file_alone(graben: Graben, tmp_path: Path) -> None:
    graben("put", str(write(tmp_path / "big", os.urandom(20 * MiB))), "/big")
    flip_byte(chunk_files(graben.store)[0])  # the smallest: the tail of the file
    (out := tmp_path / "out").mkdir()
    write(out / "big", b"old")

    failed(graben("get", "/big", str(out / "big")), "corrupt")
    assert os.listdir(out) == ["big"]  # no temporary left behind
    assert (out / "big").read_bytes() == b"old"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("2:5", b"234"), ("7:", b"789"), (":3", b"012"), ("4:4", b""), ("8:100", b"89"), ("50:", b"")],
)
def test_cat_range(graben: Graben, spec: str, expected: bytes) -> None:
    graben("put", "-", "/digits", stdin=b"0123456789")
    result = graben("cat", "/digits", "--range", spec)
    assert result.code == 0
    assert result.out == expected


@pytest.mark.parametrize("spec", ["5:2", "x:3", "3", "-1:4"])
def test_cat_refuses_a_bad_range(graben: Graben, spec: str) -> None:
    graben("put", "-", "/digits", stdin=b"0123456789")
    result = graben("cat", "/digits", "--range", spec)
    assert result.code == 2
    assert "START:END" in result.err


def test_cat_of_a_directory_fails(graben: Graben) -> None:
    graben("mkdir", "/d")
    failed(graben("cat", "/d"), "is a directory", "/d")


# --- ls / stat / du -------------------------------------------------------------------


def test_ls_lists_names_kinds_and_sizes(graben: Graben) -> None:
    graben("put", "-", "/d/b.bin", stdin=b"12345")
    graben("mkdir", "/d/a")

    assert graben("ls", "/d").text == "a/\nb.bin\n"
    entries = graben("ls", "/d", "--json").json()
    assert [(e["path"], e["kind"], e["size"]) for e in entries] == [
        ("/d/a", "directory", 0),
        ("/d/b.bin", "file", 5),
    ]
    rows = [line.split() for line in graben("ls", "-l", "-b", "/d").text.splitlines()]
    # kind, size, date, time, name
    assert [(r[0], r[1], r[4]) for r in rows] == [("dir", "0", "a/"), ("file", "5", "b.bin")]
    rows = [line.split() for line in graben("ls", "-l", "/d").text.splitlines()]
    assert [(r[1], r[2]) for r in rows] == [("0", "B"), ("5", "B")]  # human sizes by default
    assert graben("ls", "/d/b.bin").text == "/d/b.bin\n"  # a file lists as itself


def test_ls_defaults_to_the_root(graben: Graben) -> None:
    graben("mkdir", "/top")
    assert graben("ls").text == "top/\n"


def test_stat_shows_attributes(graben: Graben) -> None:
    graben("put", "-", "/s", stdin=b"x" * 2048)

    info = graben("stat", "/s", "--json").json()
    assert (info["path"], info["kind"], info["size"], info["mode"]) == ("/s", "file", 2048, 0o644)
    assert abs(info["mtime_ns"] / 1e9 - time.time()) < 60
    text = graben("stat", "/s").text
    assert "size         2048 (2.0 KiB)" in text
    assert "-rw-r--r--" in text


def test_stat_of_a_missing_path_fails(graben: Graben) -> None:
    graben("mkdir", "/d")
    failed(graben("stat", "/d/nope"), "no such file", "/d/nope")
    failed(graben("stat", "/d/nope", "--json"), "no such file")


def test_du_counts_files_and_bytes(graben: Graben) -> None:
    graben("put", "-", "/d/a", stdin=b"x" * 1000)
    graben("put", "-", "/d/sub/b", stdin=b"x" * (3 * MiB))
    graben("put", "-", "/other", stdin=b"x")

    assert graben("du", "/d", "--json").json() == {
        "path": "/d",
        "files": 2,
        "bytes": 3 * MiB + 1000,
    }
    assert graben("du", "--json").json()["files"] == 3
    assert graben("du", "/d").text == "3.0 MiB  2 files  /d\n"
    assert graben("du", "-b", "/d/a").text == "1000  1 file  /d/a\n"


# Names a line cannot show as they are, and how each prints: quoted as GNU ls quotes
# for a terminal (--quoting-style=shell-escape), so that one entry is one line and a
# shell reads the quoted form back as the name. Plain names, spaces inside included,
# print unchanged.
ODD_NAMES = {
    "a\nb": r"'a'$'\n''b'",
    "two\n\nlines": r"'two'$'\n\n''lines'",
    " lead": r"' lead'",
    "trail ": r"'trail '",
    "tab\there": r"'tab'$'\t''here'",
    "cr\r": r"'cr'$'\r'",
    "esc\x1b[31mred": r"'esc'$'\033''[31mred'",
    "sep\u2028arator": r"'sep'$'\342\200\250''arator'",
    "it's": '"it\'s"',
    "q'\nz": r"'q'\'''$'\n''z'",
    "plain name": "plain name",
    "plain": "plain",
}


def _put_names(graben: Graben, root: str, names: list[str]) -> None:
    for name in names:
        assert graben("put", "-", f"{root}/{name}", stdin=b"x").code == 0


def test_ls_prints_each_entry_on_one_line_quoting_odd_names(graben: Graben) -> None:
    _put_names(graben, "/d", list(ODD_NAMES))
    graben("mkdir", "/d/sub\ndir")
    lines = graben("ls", "/d").text.splitlines()
    assert sorted(lines) == sorted([*ODD_NAMES.values(), r"'sub'$'\n''dir'/"])
    long = graben("ls", "-l", "/d").text.splitlines()
    assert len(long) == len(ODD_NAMES) + 1
    assert sorted(line.split("  ", 3)[3] for line in long) == sorted(lines)
    assert graben("ls", "/d/a\nb").text == "'/d/a'$'\\n''b'\n"  # a file listed by its path
    entries = graben("ls", "/d", "--json").json()  # JSON has escapes of its own: names as they are
    paths = sorted(e["path"] for e in entries)
    assert paths == sorted(f"/d/{name}" for name in [*ODD_NAMES, "sub\ndir"])


def test_quoted_names_read_back_through_a_shell(graben: Graben) -> None:
    odd = [name for name, shown in ODD_NAMES.items() if name != shown]
    _put_names(graben, "/d", odd)
    shown = graben("ls", "/d").text.splitlines()
    assert len(shown) == len(odd)
    for line in shown:
        back = subprocess.run(
            ["bash", "-c", f"printf %s {line}"], capture_output=True, check=True, timeout=30
        )
        assert back.stdout.decode() in odd, line


def test_stat_and_du_show_an_odd_path_on_one_line(graben: Graben) -> None:
    graben("put", "-", "/d/a\nb", stdin=b"x" * 10)
    stat = graben("stat", "/d/a\nb").text.splitlines()
    assert stat[0] == r"path         '/d/a'$'\n''b'"
    assert len(stat) == 9
    assert stat[-1].startswith("class        replicated (as written")
    assert graben("du", "--bytes", "/d/a\nb").text == "10  1 file  '/d/a'$'\\n''b'\n"


def klass(graben: Graben, action: str, *args: str) -> Result:
    """``graben class ACTION --store STORE ARGS...``."""
    return graben("class", action, "--store", str(graben.store), *args, store=False)


def test_class_set_show_and_clear_a_path_and_stat_and_ls_l_show_it(graben: Graben) -> None:
    graben("put", "-", "/data/sub/f", stdin=b"x" * 10)
    set_ = klass(graben, "set", "/data", "ec:6+3@60m")
    assert set_.code == 0 and set_.text == "/data: ec:6+3@1h\n"
    assert "needs 9 data nodes up and this store has 1" in set_.err  # embedded: one node
    assert klass(graben, "show", "/data/sub/f").text == (
        "ec:6+3@1h (set on /data)\n"  # 10 bytes: kept by the engine, nothing to convert
    )
    state = klass(graben, "show", "--json", "/data/sub").json()
    assert state == {"name": "ec:6+3@1h", "set_on": "/data", "chunks": 0, "converted": 0}
    assert graben("stat", "--json", "/data/sub/f").json()["storage_class"]["name"] == "ec:6+3@1h"
    assert graben("ls", "-l", "/data").text.splitlines()[0] == "class ec:6+3@1h (set on /data)"
    assert klass(graben, "clear", "/data").code == 0
    assert klass(graben, "show", "/data/sub/f").text.startswith("replicated (as written")
    assert not graben("ls", "-l", "/data").text.startswith("class")


def test_class_with_a_wrong_name_or_path_says_so_and_changes_nothing(graben: Graben) -> None:
    graben("mkdir", "/data")
    failed(klass(graben, "set", "/data", "raid6"), "unknown storage class", "ec:K+M")
    failed(klass(graben, "set", "/data", "ec:6+3@soon"), "a number with s, m, h or d")
    failed(klass(graben, "set", "/missing", "ec:6+3"), "no such file")
    assert klass(graben, "show", "/data").text.startswith("replicated")
    assert graben("class", store=False).code == 2  # an action is required (a usage error)


# --- mkdir / rm / mv ------------------------------------------------------------------


def test_mkdir_needs_p_for_missing_parents(graben: Graben) -> None:
    graben("mkdir", "/top")
    failed(graben("mkdir", "/top/a/b"), "no such file")
    assert graben("mkdir", "-p", "/top/a/b").code == 0
    assert graben("mkdir", "-p", "/top/a/b").code == 0  # -p: existing is fine
    failed(graben("mkdir", "/top/a/b"), "exists")
    assert graben("stat", "/top/a/b", "--json").json()["kind"] == "directory"


def test_rm_refuses_a_non_empty_directory_without_r(graben: Graben) -> None:
    graben("put", "-", "/d/f", stdin=b"f")

    failed(graben("rm", "/d"), "not empty", "rm -r", "/d")
    assert graben("cat", "/d/f").out == b"f"
    assert graben("rm", "-r", "/d").code == 0
    failed(graben("stat", "/d"), "no such file")


def test_rm_removes_a_file_and_reports_a_missing_one(graben: Graben) -> None:
    graben("put", "-", "/f", stdin=b"f")
    assert graben("rm", "/f").code == 0
    assert graben("ls").out == b""
    failed(graben("rm", "/f"), "no such file", "/f")


def test_mv_renames_and_moves_into_directories(graben: Graben) -> None:
    graben("put", "-", "/a", stdin=b"A")
    graben("mkdir", "/dir")

    assert graben("mv", "/a", "/b").code == 0
    assert graben("mv", "/b", "/dir").code == 0  # into an existing directory
    assert graben("mv", "/dir/b", "/new/").code == 0  # trailing slash: into a directory

    assert graben("ls", "/").text == "dir/\nnew/\n"
    assert graben("cat", "/new/b").out == b"A"


def test_mv_replaces_unless_no_clobber(graben: Graben) -> None:
    graben("put", "-", "/a", stdin=b"A")
    graben("put", "-", "/b", stdin=b"B")

    failed(graben("mv", "--no-clobber", "/a", "/b"), "exists", "/b")
    assert graben("cat", "/a").out == b"A"
    assert graben("cat", "/b").out == b"B"
    assert graben("mv", "/a", "/b").code == 0
    assert graben("cat", "/b").out == b"A"


def test_mv_of_a_missing_source_fails(graben: Graben) -> None:
    graben("mkdir", "/d")
    failed(graben("mv", "/nope", "/d/x"), "no such file", "/nope")
