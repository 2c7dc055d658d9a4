"""``graben bench``: registry, runner, report and CLI. Correctness only, never timing."""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from bench_kit import quiet_run
from rich.console import Console

from graben.bench import Context, Rated, Result, Skip, Workload, _peers, discover, rate, select
from graben.bench._cli import wide_console
from graben.bench._plot import BASELINE_COLOR, GRABEN_COLOR, PEER_COLOR, _color, plot
from graben.bench._report import table
from graben.bench._runner import Settings, combine, run
from graben.store import InvalidArgument
from graben.store.cli._main import build_parser, main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RESULT_KEYS = {"workload", "system", "value", "unit", "baseline", "ratio"}
MACHINE_KEYS = {
    "cpu",
    "cores",
    "cores_usable",
    "memory_bytes",
    "python",
    "kernel",
    "scratch",
    "filesystem",
    "device",
    "free_bytes",
    "graben",
    "date",
}
SEQUENTIAL = {"write", "read-warm", "read-cold"}


def _result(workload: str, system: str, value: float, baseline: str = "base") -> Result:
    return Result(workload, system, value, "GB/s", baseline)


def _quiet() -> Console:
    return Console(file=io.StringIO())


# -- ratios ----------------------------------------------------------------------


def test_ratio_is_value_over_the_named_baseline_of_the_same_workload() -> None:
    rated = rate(
        [
            _result("w1", "graben", 3.0),
            _result("w1", "base", 4.0),
            _result("w1", "other", 2.0),
            _result("w2", "graben", 9.0),
            _result("w2", "base", 1.0),
        ]
    )
    assert [r.ratio for r in rated] == [0.75, 1.0, 0.5, 9.0, 1.0]


def test_ratio_is_none_without_a_usable_baseline() -> None:
    rated = rate(
        [
            _result("w1", "graben", 3.0, baseline="absent"),
            _result("w2", "graben", 3.0),
            _result("w2", "base", 0.0),
        ]
    )
    assert [r.ratio for r in rated] == [None, None, None]


def test_a_result_must_be_finite_and_named() -> None:
    with pytest.raises(ValueError, match="finite"):
        _result("w", "s", math.nan)
    with pytest.raises(ValueError, match="baseline"):
        Result("w", "s", 1.0, "GB/s", "")


# -- registry --------------------------------------------------------------------


def test_the_first_workloads_are_registered_in_run_order() -> None:
    names = [w.name for w in discover()]
    assert names[:3] == ["write", "read-warm", "read-cold"]


@pytest.mark.parametrize(
    ("patterns", "expected"),
    [
        ([], ["write", "read-warm", "read-cold"]),
        (["read"], ["read-warm", "read-cold"]),
        (["read-*"], ["read-warm", "read-cold"]),
        (["read-cold", "write"], ["write", "read-cold"]),
        (["*-warm"], ["read-warm"]),
        (["read-warm"], ["read-warm"]),  # a whole name is that workload alone
    ],
)
def test_select_by_name_glob_or_family_in_run_order(
    patterns: list[str], expected: list[str]
) -> None:
    available = [w for w in discover() if w.name in SEQUENTIAL]
    assert [w.name for w in select(available, patterns)] == expected


def test_a_whole_name_is_not_a_family_too() -> None:
    """``graben bench mount-read`` ran mount-read-warm as well."""
    names = {w.name for w in discover()}
    assert {"mount-read", "mount-read-warm"} <= names
    assert [w.name for w in select(discover(), ["mount-read"])] == ["mount-read"]
    assert {"mount-read", "mount-read-warm"} <= {w.name for w in select(discover(), ["mount"])}


def test_select_names_the_patterns_that_match_nothing() -> None:
    with pytest.raises(InvalidArgument, match="nosuch"):
        select(discover(), ["write", "nosuch"])


# -- runner ----------------------------------------------------------------------


def test_combine_takes_the_median_per_system() -> None:
    trials = [
        [_result("w", "graben", v), _result("w", "base", b)]
        for v, b in [(1.0, 10.0), (5.0, 30.0), (3.0, 20.0)]
    ]
    assert combine("w", trials) == [_result("w", "graben", 3.0), _result("w", "base", 20.0)]


def test_combine_refuses_results_of_another_workload() -> None:
    with pytest.raises(ValueError, match="other"):
        combine("w", [[_result("other", "base", 1.0)]])


def test_run_repeats_trials_in_fresh_scratch_and_reports_skips(tmp_path: Path) -> None:
    seen: list[tuple[int, bool]] = []

    def counting(ctx: Context) -> Iterable[Result]:
        seen.append((ctx.trial, not any(ctx.scratch.iterdir())))
        (ctx.scratch / "leftover").write_bytes(b"x")
        return [_result("counting", "graben", ctx.trial + 1.0), _result("counting", "base", 1.0)]

    def skipping(ctx: Context) -> Iterable[Result]:
        raise Skip("needs a GPU")

    workloads = [Workload("counting", "", counting), Workload("skipping", "", skipping)]
    outcome = run(workloads, Settings(size=1, quick=True, repeat=3), tmp_path, _quiet())
    assert seen == [(0, True), (1, True), (2, True)]
    assert outcome.results == (_result("counting", "graben", 2.0), _result("counting", "base", 1.0))
    assert outcome.skipped == (("skipping", "needs a GPU"),)


# -- plot --------------------------------------------------------------------------


def test_plot_writes_a_png_even_without_a_baseline(tmp_path: Path) -> None:
    rated = [
        Rated(_result("w1", "graben", 0.9), 0.9),
        Rated(_result("w1", "base", 1.0), 1.0),
        Rated(_result("w2", "graben", 2.0, baseline="gone"), None),
    ]
    plot(rated, tmp_path / "p.png", "title")
    assert (tmp_path / "p.png").read_bytes().startswith(PNG_MAGIC)


def test_plot_draws_graben_and_the_peers_side_by_side_in_their_colours(tmp_path: Path) -> None:
    """Each workload's systems are bars next to each other: graben's in one colour, the
    peers in another, the baseline grey, a peer's durable twin hatched."""
    rated = [
        Rated(_result("mount-create", "graben embedded", 1.0, baseline="graben embedded"), 1.0),
        Rated(_result("mount-create", "graben cluster", 0.6, baseline="graben embedded"), 0.6),
        Rated(_result("mount-create", "JuiceFS", 1.6, baseline="graben embedded"), 1.6),
        Rated(_result("mount-create", "JuiceFS, then sync", 1.5, baseline="graben embedded"), 1.5),
        Rated(_result("dataset-epoch", "pyarrow", 1.0, baseline="pyarrow"), 1.0),
        Rated(_result("dataset-epoch", "CachedDataset warm", 1.2, baseline="pyarrow"), 1.2),
        Rated(_result("dataset-epoch", "Mosaic Streaming", 0.02, baseline="pyarrow"), 0.02),
    ]
    colours = [_color(row) for row in rated]
    assert colours == [
        BASELINE_COLOR,
        GRABEN_COLOR,
        PEER_COLOR,
        PEER_COLOR,
        BASELINE_COLOR,
        GRABEN_COLOR,
        PEER_COLOR,
    ]
    plot(rated, tmp_path / "p.png", "peers")
    assert (tmp_path / "p.png").read_bytes().startswith(PNG_MAGIC)


# -- the command -------------------------------------------------------------------


def test_list_names_every_workload(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    for name in SEQUENTIAL:
        assert name in out


def test_unknown_workload_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "nosuch", "--size-mib", "1"]) == 1
    assert "nosuch" in capsys.readouterr().err


def test_sizes_must_be_positive() -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--size", "0"])


@pytest.mark.parametrize(
    ("text", "size"),
    [("2", 2 << 30), ("0.5", 512 << 20), ("512M", 512 << 20), ("3GiB", 3 << 30), ("1k", 1024)],
)
def test_size_is_gib_or_a_human_size(text: str, size: int) -> None:
    assert build_parser("bench").parse_args(["bench", "--size", text]).size == size


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "5X", "1e30", "0.0000000001"])
def test_size_refuses_what_is_no_size(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["bench", "--size", text])
    assert exit.value.code == 2
    assert "--size" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    """One tiny end-to-end run of every sequential workload, twice each."""
    root = tmp_path_factory.mktemp("bench")
    args = ["bench", *sorted(SEQUENTIAL), "--size", "3MiB", "--repeat", "2"]
    args += ["--dir", str(root / "scratch"), "--json", str(root / "r.json")]
    args += ["--plot", str(root / "r.png")]
    capture = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stdout", capture)
        assert main(args) == 0
    return root, json.loads((root / "r.json").read_text()), capture.getvalue()


def test_json_has_exactly_the_documented_shape(
    tiny_run: tuple[Path, dict[str, Any], str],
) -> None:
    _, doc, _ = tiny_run
    assert set(doc) == {"machine", "results"}
    assert set(doc["machine"]) == MACHINE_KEYS
    for row in doc["results"]:
        assert set(row) == RESULT_KEYS
        assert isinstance(row["value"], float)
        assert row["value"] > 0


def test_every_workload_has_graben_and_its_baseline(
    tiny_run: tuple[Path, dict[str, Any], str],
) -> None:
    _, doc, _ = tiny_run
    rows = {(r["workload"], r["system"]): r for r in doc["results"]}
    assert {w for w, _ in rows} == SEQUENTIAL
    for name in SEQUENTIAL:
        graben = rows[name, "graben embedded"]
        base = rows[name, graben["baseline"]]
        assert base["ratio"] == 1.0
        assert graben["ratio"] == pytest.approx(graben["value"] / base["value"])


def test_the_run_prints_its_table_and_draws_the_plot(
    tiny_run: tuple[Path, dict[str, Any], str],
) -> None:
    root, _, out = tiny_run
    assert "plain write+fsync" in out
    assert "read-cold" in out
    assert "plain write+fsync (baseline)" in out
    assert (root / "r.png").read_bytes().startswith(PNG_MAGIC)


def test_the_table_in_a_pipe_keeps_each_row_on_one_line() -> None:
    """As in ``make run``'s log: a wide row is printed whole, not wrapped at 80 columns."""
    long = "SeaweedFS, then sync, with a name far longer than any terminal's default width"
    rows = rate(
        [
            Result("mount-create", "graben", 1.0, "files/s", "graben"),
            Result("mount-create", long, 2.0, "files/s", "graben"),
        ]
    )
    for stream in ("stdout", "stderr"):  # the table; the progress and each workload's figures
        capture = io.StringIO()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(f"sys.{stream}", capture)
            wide_console(stderr=stream == "stderr").print(table(rows))
        lines = capture.getvalue().splitlines()
        assert any(long in line and "2.00x" in line for line in lines), stream


def test_the_scratch_directory_is_removed(tiny_run: tuple[Path, dict[str, Any], str]) -> None:
    root, _, _ = tiny_run
    assert list((root / "scratch").iterdir()) == []


def test_reads_write_their_own_file_when_write_did_not_run(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    args = ["bench", "read-cold", "--size-mib", "2", "--dir", str(tmp_path), "--json", str(out)]
    assert main(args) == 0
    doc = json.loads(out.read_text())
    assert {(r["workload"], r["system"]) for r in doc["results"]} == {
        ("read-cold", "graben embedded"),
        ("read-cold", "plain read"),
    }


@pytest.mark.slow
def test_fsspec_workloads_measure_the_client_and_s3fs_beside_graben(tmp_path: Path) -> None:
    """A tiny run of the fsspec workloads: real cluster, real moto server, every system reported."""
    rows = quiet_run(tmp_path, "fsspec-*", "--size-mib", "3")
    systems = {(r["workload"], r["system"]) for r in rows}
    for name in ("fsspec-pipe", "fsspec-cat"):
        assert {(name, "graben fsspec"), (name, "graben client"), (name, "s3fs -> moto")} <= systems
    assert all(r["value"] > 0 and r["baseline"] == "graben client" for r in rows)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse")
def test_fuse_workloads_measure_the_mount_beside_the_client(tmp_path: Path) -> None:
    """A tiny run of the FUSE workloads: real mounts, every system reported, none left."""
    rows = quiet_run(tmp_path, "fuse-*", "--size-mib", "8", "--quick")
    systems = {(r["workload"], r["system"]) for r in rows}
    for name in ("fuse-write", "fuse-read", "fuse-read-warm"):
        for block in (1, 4):
            assert (name, f"FUSE mount, {block} MiB calls") in systems
            assert (name, f"direct client, {block} MiB calls") in systems
    assert ("fuse-small", "FUSE create+write+close") in systems
    assert all(r["value"] > 0 for r in rows)
    with open("/proc/self/mountinfo") as table:
        assert str(tmp_path) not in table.read()


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse")
def test_mount_workloads_measure_graben_beside_juicefs_and_seaweedfs(tmp_path: Path) -> None:
    """A tiny run of the mount workloads on real JuiceFS and SeaweedFS mounts (one copy and
    three) beside graben's (embedded and cluster): every system in every table, durable
    twins for the peers, and nothing left mounted or running after."""
    rows = quiet_run(tmp_path, "mount-*", "--size-mib", "8", "--quick")
    systems = {(r["workload"], r["system"]) for r in rows}
    peers = ("graben embedded", "graben cluster", "SeaweedFS", "SeaweedFS 002", "JuiceFS")
    for name in ("mount-create", "mount-stat", "mount-write", "mount-torch-save"):
        assert {(name, system) for system in peers} <= systems, name
    for name in ("mount-read", "mount-read-warm", "mount-reread", "mount-memory"):
        assert {(name, system) for system in peers} <= systems, name
    for name in ("mount-create", "mount-torch-save"):
        assert {(name, f"{peer}, then sync") for peer in peers[2:]} <= systems
        assert (name, "graben embedded, then sync") not in systems  # its fsync is durable
    assert all(r["value"] > 0 for r in rows)
    reread = [r for r in rows if r["workload"] == "mount-reread"]
    assert {r["baseline"] for r in reread} == {"plain file, page cache"}  # beside the kernel's
    tools = [r for r in rows if r["workload"] == "mount-tools"]  # beside the local disk
    assert {f"find: {system}" for system in ("graben cluster RF=1", *peers[2:3], peers[4])} <= {
        r["system"] for r in tools
    }
    idle = [r for r in rows if r["system"].endswith(", idle 5 s")]  # beside graben's, idle
    assert {r["baseline"] for r in idle} == {"graben embedded, idle 5 s"}
    assert {r["system"] for r in idle} >= {"graben embedded, idle 5 s", "JuiceFS, idle 5 s"}
    others = reread + tools + idle
    assert all(r["baseline"] == "graben embedded" for r in rows if r not in others)
    with open("/proc/self/mountinfo") as table:
        assert str(tmp_path) not in table.read()
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, check=False)
    assert left.stdout == b"", "a peer's process outlived the run"


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse")
def test_seaweedfs_002_keeps_three_copies_on_its_three_volume_servers(tmp_path: Path) -> None:
    """The peer that stands beside graben's cluster (RF=3) keeps as many copies as it."""
    root, data = tmp_path / "seaweedfs", os.urandom(3 * 2**20)
    with _peers.seaweedfs(root, replication="002") as mount:
        assert mount.name == "SeaweedFS 002"
        (mount.point / "f.bin").write_bytes(data)
        os.sync()
        held = [sum(f.stat().st_size for f in (root / v).glob("*.dat")) for v in ("v1", "v2", "v3")]
    assert all(size >= len(data) for size in held), held


@pytest.mark.slow
def test_ckpt_workloads_measure_s3torchconnector_on_moto_beside_dcp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tiny run of ckpt-save and ckpt-load: s3torchconnector's S3StorageWriter and Reader
    on the run's moto, beside DCP's writers (the load job checks every value it reads)."""
    discover()  # importing a workload module first would register its workloads out of order
    from graben.bench._workloads import checkpoint

    every = checkpoint._systems  # each system costs three 2-rank jobs: the S3 ones and the base
    kept = ("(s3torchconnector) -> moto", checkpoint.BASELINE)  # s3fs: in the bench runs
    monkeypatch.setattr(
        checkpoint, "_systems", lambda *a: [s for s in every(*a) if s.name.endswith(kept)]
    )
    monkeypatch.setattr(checkpoint, "_mounted", lambda ctx: [])  # the mount tests start those
    monkeypatch.setattr(checkpoint, "SETTLE_S", 0.0)
    rows = quiet_run(tmp_path, "ckpt-save", "ckpt-load", "--size-mib", "8", "--quick")
    values = {(r["workload"], r["system"]): r["value"] for r in rows}
    for row in (
        ("ckpt-save", "DCP S3StorageWriter (s3torchconnector) -> moto"),
        ("ckpt-load", "DCP S3StorageReader (s3torchconnector) -> moto"),
        ("ckpt-save", checkpoint.BASELINE),
        ("ckpt-load", checkpoint.READ_BASELINE),
    ):
        assert values.get(row, 0.0) > 0, row


@pytest.mark.slow
def test_the_dataset_workload_measures_cold_warm_and_the_loaders_beside_pyarrow(
    tmp_path: Path,
) -> None:
    """A tiny run of dataset-epoch: a real cluster and moto, s3torchconnector on moto, graben's
    loader and WebDataset's with and without workers (every row counted once: the workload
    checks the sums), start-up apart; a peer whose job fails left out, not the workload."""
    with pytest.MonkeyPatch.context() as mp:
        # A Python that fails: Mosaic and LitData are left out, the rest still measured.
        mp.setenv("GRABEN_PEERS_PYTHON", shutil.which("false") or "/bin/false")
        rows = quiet_run(tmp_path, "dataset-epoch", "--size-mib", "8", "--quick")
    systems = {(r["system"], r["unit"]) for r in rows}
    for system in (
        "pyarrow, local Parquet",
        "CachedDataset epoch 1 (cold) from the cluster",
        "CachedDataset epoch 1 (cold) from moto S3",
        "CachedDataset epoch 2 (warm cache)",
        "s3torchconnector S3IterableDataset (cold) from moto S3",
    ):
        assert {(system, "samples/s"), (f"{system}, in bytes", "GB/s")} <= systems
    for how in ("in the loop's process", "2 DataLoader workers"):
        for loader in ("graben CachedLoader, cluster", "WebDataset, local tar"):
            assert (f"{loader}, warm, {how}", "samples/s") in systems
            assert (f"{loader}, start-up, {how}", "s") in systems
    assert not any(r["system"].startswith(("Mosaic", "LitData")) for r in rows)
    startups = [r for r in rows if r["unit"] == "s"]
    assert all(r["baseline"].startswith("graben CachedLoader") for r in startups)
    assert all(r["value"] > 0 and r["workload"] == "dataset-epoch" for r in rows)


@pytest.mark.slow
def test_the_tls_workloads_measure_tls_beside_plaintext(tmp_path: Path) -> None:
    """A tiny run of cluster-tls-*: a plaintext and a TLS cluster, both measured each trial."""
    rows = quiet_run(tmp_path, "cluster-tls", "--size-mib", "8", "--quick")
    systems = {(r["workload"], r["system"]) for r in rows}
    for name in ("cluster-tls-write", "cluster-tls-read"):
        assert {
            (name, "graben cluster RF=1, plaintext"),
            (name, "graben cluster RF=1, TLS"),
        } == {s for s in systems if s[0] == name}
    assert all(r["value"] > 0 and r["baseline"] == "graben cluster RF=1, plaintext" for r in rows)
