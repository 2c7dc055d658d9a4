"""Row checksums: every row that says what a file is carries a sum of its values.

A flipped bit in a database usually leaves its pages well formed and a value
changed: an mtime goes negative, a name changes a letter, an extent starts
elsewhere in its chunk. Cross-checks (``_checks.py``) catch what contradicts
another table; a value nothing else repeats is caught only by a sum of the
row. Each summed table has a ``sum`` column the engine itself computes from
the row's values whenever the row is written (a stored generated column, so
writes in SQL, such as a reference count taken with ``refs + 1``, keep it
true), with ``graben_sum``: SQLite calls ``row_sum`` below, PostgreSQL a SQL
function of the same definition (``POSTGRES_FUNCTION``). Reads compute it
again from the values they got and raise ``IntegrityError`` when it
differs; fsck asks the engine for every row whose sum differs.

The definition, for both engines and Python: the values as text, joined
with ``/``, hashed with MD5 (in every PostgreSQL, no extension needed; a
checksum, not a defence against someone who can write the database), the
first 60 bits as a number. A row written again through graben gets a fresh
sum, so a damaged row is read (and refused) before it is rewritten.
"""

from __future__ import annotations

import hashlib

from .._repo import INODE_COLUMNS

SUMMED = {
    "inodes": INODE_COLUMNS.split(", "),
    "entries": ["parent", "name", "inode"],
    "extents": ["inode", '"offset"', "length", "chunk", "chunk_offset"],
    "chunks": ["id", "length", "crc32c"],
}
"""The columns each summed table's ``sum`` covers, in order. A chunk's reference count is
left out: fsck counts the extents that use it."""
TEXT = {"inodes": "kind", "entries": "name", "extents": "chunk", "chunks": "id"}
"""Each table's column of text; the others are numbers, cast (``graben_sum`` takes text)."""
FUNCTION = "graben_sum"

POSTGRES_FUNCTION = (
    f"CREATE OR REPLACE FUNCTION {FUNCTION}(VARIADIC parts text[]) RETURNS bigint "
    "LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS "
    "$$ SELECT ('x' || substr(md5(array_to_string(parts, '/')), 1, 15))::bit(60)::bigint $$"
)


_JOINED = ["/".join(["%s"] * n) for n in range(32)]
"""``str(value)`` of n values joined with ``/`` (a format made once: 3x a ``join``)."""


def row_sum(*values: object) -> int:
    """The sum of a row's values (as ``graben_sum`` computes it in the engine)."""
    text = (_JOINED[len(values)] % values).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.md5(text, usedforsecurity=False).digest()[:8], "big") >> 4


def expression(table: str, alias: str = "") -> str:
    """SQL for the sum of a row of ``table``, from its columns (named through ``alias``)."""
    prefix = f"{alias}." if alias else ""
    parts = [
        f"{prefix}{c}" if c == TEXT[table] else f"CAST({prefix}{c} AS TEXT)" for c in SUMMED[table]
    ]
    return f"{FUNCTION}({', '.join(parts)})"
