"""The mount's inode table, a pure core: paths numbered for the kernel, a file with
several names under one number, renames and unlinks carrying numbers along."""

from __future__ import annotations

from graben.fuse._inodes import ROOT, InodeTable


def test_names_of_one_file_share_its_number_until_the_last_goes() -> None:
    table = InodeTable()
    a = table.lookup("/a", file=70)
    assert table.lookup("/d/b", file=70) == a  # found by the store's inode of the file
    table.alias("/c", a)  # a link made through the mount
    assert table.names(a) == 3 and table.peek("/c") == a
    table.removed("/a")  # the name store calls used goes: another takes its place
    assert table.path(a) in ("/d/b", "/c") and table.names(a) == 2
    table.moved("/d", "/e")  # a directory renamed: the names below it follow
    assert table.peek("/e/b") == a and table.peek("/d/b") is None
    table.removed("/e/b")
    table.removed("/c")
    assert table.names(a) == 0  # open handles may still hold it, but no name leads to it
    table.forget(a, 2)
    assert table.peek("/c") is None and len(table) == 1


def test_a_rename_onto_another_name_of_the_same_file_keeps_the_other() -> None:
    table = InodeTable()
    a = table.lookup("/a", file=9)
    table.alias("/b", a)
    other = table.lookup("/x")
    table.moved("/x", "/b")  # /b named the file; now it names /x's
    assert table.peek("/b") == other and table.names(a) == 1 and table.path(a) == "/a"


def test_forgetting_drops_every_name_and_the_file_key() -> None:
    table = InodeTable()
    a = table.lookup("/a", file=5)
    table.alias("/b", a)
    table.forget(a, 1)
    assert table.peek("/a") is None and table.peek("/b") is None
    assert table.lookup("/b", file=5) != a  # a fresh number, not the forgotten one
    assert table.path(ROOT) == "/"
