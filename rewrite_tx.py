"""Rewrite calls on a metadata transaction to go through its concerns: ``tx.lookup(`` becomes
``tx.tree.lookup(``, ``tx.replicas(`` becomes ``tx.chunks.replicas(``, and so on.

Issue 52 split the repository's one ``Tx`` protocol (store/meta/_repo.py) into narrow
protocols by concern, which a transaction holds as attributes. This script moves every call
site over, and can be run again over any tree (after a merge, say): a call already rewritten
is left as it is, so a second run changes nothing.

    python rewrite_tx.py [PATH ...]          # default: store tests; files or folders
    python rewrite_tx.py --check [PATH ...]  # say what would change, change nothing (exit 1 if any)

A rewritten line may grow past the line length: the files it changes are then formatted
with ruff (``.venv/bin/ruff``, or ``ruff`` on the path), as ``make lint`` wants them.
Only calls on a variable named ``tx`` are rewritten (every transaction in the store is so
named); a method named without a call (``tx.path_of`` passed along) is reported, not changed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

CONCERNS: dict[str, tuple[str, ...]] = {
    "tree": (
        "lookup",
        "walk",
        "get",
        "locked",
        "locked_entry",
        "locked_entries",
        "lock_tree",
        "children",
        "children_page",
        "has_children",
        "create",
        "update",
        "touch",
        "relink",
        "link",
        "unlink",
        "path_of",
    ),
    "files": (
        "create_file",
        "create_files",
        "set_extents",
        "extents",
        "extents_page",
        "delete",
        "chunk_users",
    ),
    "chunks": (
        "add_chunks",
        "inline",
        "referenced",
        "known",
        "replicas",
        "named",
        "chunk_page",
        "add_replicas",
        "drop_replica",
        "degraded",
        "forget_unreferenced",
    ),
    "stripes": (
        "set_class",
        "classes",
        "classed",
        "stripes",
        "unstriped",
        "stripe",
        "short_stripes",
        "striped",
        "place_piece",
    ),
    "tenants": ("add_tenant", "tenants", "add_token", "tokens", "revoke"),
    "quotas": ("quotas", "quotas_within", "set_quota", "drop_quotas", "move_quotas", "add_usage"),
    "feed": ("record_changes", "forget_changes", "changes_after", "change_bounds"),
    "keys": ("outcomes", "record_outcomes", "forget_outcomes"),
    "nodes": ("upsert_node", "nodes"),
    "services": ("now", "lease", "set_lease", "upsert_service", "services", "forget_services"),
    "bad": ("add_bad", "bad_copies", "bad_count", "forget_bad"),
    "identity": ("store_id", "sealed", "seal"),
}
"""Each concern (an attribute of ``Tx``) and the methods it holds."""
KEPT = ("savepoint", "inconsistencies")
"""Methods that stay on ``Tx`` itself."""

CONCERN_OF = {method: concern for concern, methods in CONCERNS.items() for method in methods}
RECEIVER = r"(?<![\w.])tx"
"""A variable named ``tx``, not an attribute (``self.tx``) nor part of a longer name."""
CALL = re.compile(RECEIVER + r"\.(" + "|".join(sorted(CONCERN_OF, key=len, reverse=True)) + r")\(")
BARE = re.compile(RECEIVER + r"\.(" + "|".join(CONCERN_OF) + r")\b(?![(.])")


def rewrite(text: str) -> str:
    """``text`` with every ``tx.method(`` as ``tx.<concern>.method(``."""
    return CALL.sub(lambda m: f"tx.{CONCERN_OF[m.group(1)]}.{m.group(1)}(", text)


def files(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for name in paths:
        path = Path(name)
        skip = {".venv", "build", ".git"}
        tree = [path] if path.is_file() else sorted(path.rglob("*.py"))
        found += [p for p in tree if not skip & set(p.parts)]
    return found


def formatted(paths: list[Path]) -> None:
    """Format the files rewritten, as ``make lint`` wants them (ruff wraps long lines)."""
    ruff = next(
        (r for r in (".venv/bin/ruff", shutil.which("ruff")) if r and Path(r).exists()), None
    )
    if ruff is None:
        print("ruff not found: run `ruff format` on the files rewritten")
    elif paths:
        subprocess.run([ruff, "format", "-q", *map(str, paths)], check=True)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [a for a in argv if a != "--check"] or ["store", "tests"]
    changed: list[Path] = []
    for path in files(paths):
        text = path.read_text()
        new = rewrite(text)
        for number, line in enumerate(new.splitlines(), 1):
            for m in BARE.finditer(line):
                if m.group(1) not in CONCERNS:  # ``tx.stripes`` alone is the concern itself
                    print(f"{path}:{number}: tx.{m.group(1)} without a call: rewrite it by hand")
        if new != text:
            changed.append(path)
            print(f"{'would rewrite' if check else 'rewrote'} {path}")
            if not check:
                path.write_text(new)
    if not check:
        formatted(changed)
    print(f"{len(changed)} file(s) {'to rewrite' if check else 'rewritten'}")
    return 1 if check and changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
