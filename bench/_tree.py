"""A generated tree of files for ``mount-tools``: a source tree with its packages.

``shape`` is pure: from a file count and a largest size it returns the same
entries every time (nested directories, names, sizes). ``write`` puts a shape
on disk with every file starting with a ``nonce`` of the caller's, so two
trees of one shape share no file's bytes and graben's deduplication of equal
chunks cannot skip work a peer does (each write step of a trial writes a tree
of its own).

The mix (by count): 5% empty, 25% a few bytes to 200, 48% source files of
1-12 KiB of text, 20% of 16-64 KiB (text or binary), 2% of 128 KiB up to the
largest (binary): about 22 KiB a file, ~45 MB for 2,000 files of up to 1 MiB.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from pathlib import Path

KiB = 1 << 10
SEED = 53
"""The shape's seed: the same tree in every run."""
POOL = 2 << 20
"""Bytes of text and of random bytes each file's body is cut from."""
TOP = ("src", "tests", "docs", "vendor", "assets", "build")
WORDS = (
    "core", "util", "io", "net", "cache", "store", "model", "view", "api", "cli",
    "parse", "index", "plan", "node", "meta", "async", "sync", "types", "config", "log",
)  # fmt: skip
TEXT_EXT = (".py", ".c", ".h", ".rs", ".js", ".md", ".toml", ".txt")
BINARY_EXT = (".so", ".o", ".png", ".whl", ".bin")


@dataclass(frozen=True, slots=True)
class Entry:
    """One file of a generated tree."""

    path: str
    """Where it lies, relative to the tree's root."""
    size: int
    """Its length in bytes."""
    text: bool
    """Whether it reads as a source file (else random bytes)."""


def shape(files: int, largest: int = 1 << 20, seed: int = SEED) -> list[Entry]:
    """``files`` entries in nested directories, sizes of the module's mix up to ``largest``."""
    rng = random.Random(seed)
    dirs = _dirs(rng, max(len(TOP), files // 8))
    return [_entry(rng, i, rng.choice(dirs), largest) for i in range(files)]


def _dirs(rng: random.Random, count: int) -> list[str]:
    """``count`` directories under ``TOP``, each inside an earlier one, at most 7 deep."""
    dirs = list(TOP)
    while len(dirs) < count:
        parent = rng.choice(dirs)
        if parent.count("/") < 6:
            dirs.append(f"{parent}/{rng.choice(WORDS)}{len(dirs)}")
    return dirs


def _entry(rng: random.Random, i: int, where: str, largest: int) -> Entry:
    kind = rng.random()
    if kind < 0.05:
        size, text = 0, True
    elif kind < 0.30:
        size, text = rng.randint(1, 200), True
    elif kind < 0.78:
        size, text = rng.randint(1 * KiB, 12 * KiB), True
    elif kind < 0.98:
        size, text = rng.randint(16 * KiB, 64 * KiB), rng.random() < 0.5
    else:
        size, text = rng.randint(128 * KiB, max(128 * KiB, largest)), False
    ext = rng.choice(TEXT_EXT if text else BINARY_EXT)
    return Entry(f"{where}/{rng.choice(WORDS)}_{i}{ext}", min(size, largest), text)


def write(root: Path, entries: list[Entry], nonce: str) -> int:
    """The entries under ``root`` (made), each file's first bytes ``nonce`` and its index;
    the bytes written."""
    text, binary = _pools()
    total = 0
    for i, entry in enumerate(entries):
        path = root / entry.path
        path.parent.mkdir(parents=True, exist_ok=True)
        head = f"# {nonce} {i}\n".encode()
        pool = text if entry.text else binary
        at = (i * 104_729) % (len(pool) - entry.size + 1)
        body = head[: entry.size] + pool[at : at + max(0, entry.size - len(head))]
        path.write_bytes(body)
        total += len(body)
    return total


@functools.cache
def _pools() -> tuple[bytes, bytes]:
    """``POOL`` bytes of source-like lines, and ``POOL`` random bytes (the same each run)."""
    rng = random.Random(SEED)
    lines, size = [], 0
    while size < POOL:
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9)))
        lines.append(f"{'    ' * rng.randint(0, 3)}{words}\n")
        size += len(lines[-1])
    return "".join(lines).encode()[:POOL], rng.randbytes(POOL)
