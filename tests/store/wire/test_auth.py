"""Auth primitives: tokens, capabilities, and where the cluster secret comes from."""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from graben.store import InvalidArgument, NotFound, PermissionDenied
from graben.store._types import OPS, Capability, Op
from graben.store.wire._auth import (
    ENV_SECRET,
    ENV_SECRET_FILE,
    _capability_message,
    check,
    check_token,
    client_token,
    grant,
    load_secret,
    new_secret,
)

SECRET = b"0123456789abcdef-test-secret"
OTHER = b"fedcba9876543210-other-secret"
NOW = 1_700_000_000.0

secrets_ = st.binary(min_size=16, max_size=64)
ops = st.sampled_from(OPS)
chunks = st.text(max_size=80)
times = st.floats(min_value=0, max_value=4e9, allow_nan=False)
ttls = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's own secret out of these tests."""
    monkeypatch.delenv(ENV_SECRET, raising=False)
    monkeypatch.delenv(ENV_SECRET_FILE, raising=False)


def _secret_file(path: Path, content: bytes | str, mode: int = 0o600) -> Path:
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    path.chmod(mode)
    return path


# Tokens


def test_token_is_deterministic_hex() -> None:
    token = client_token(SECRET)
    assert token == client_token(SECRET)
    assert len(token) == 64
    assert int(token, 16) >= 0
    check_token(SECRET, token)


def test_token_depends_on_the_secret() -> None:
    assert client_token(SECRET) != client_token(OTHER)
    with pytest.raises(PermissionDenied, match="invalid or missing token"):
        check_token(SECRET, client_token(OTHER))


@pytest.mark.parametrize("token", ["", " ", "0" * 64, "é" * 64, "\udc80"])
def test_bad_tokens_are_denied(token: str) -> None:
    with pytest.raises(PermissionDenied) as info:
        check_token(SECRET, token)
    assert info.value.message.startswith("invalid or missing token: ")


def test_token_with_trailing_junk_is_denied() -> None:
    with pytest.raises(PermissionDenied):
        check_token(SECRET, client_token(SECRET) + "0")
    with pytest.raises(PermissionDenied):
        check_token(SECRET, client_token(SECRET)[:-1])


@given(secrets_, st.text())
def test_any_other_token_is_denied(secret: bytes, token: str) -> None:
    assume(token != client_token(secret))
    with pytest.raises(PermissionDenied, match="invalid or missing token"):
        check_token(secret, token)


def test_token_is_not_a_capability_mac() -> None:
    cap = grant(SECRET, "", "read", 1.0, 0.0)
    assert cap.mac != client_token(SECRET)


# Capabilities


@given(secrets_, chunks, ops, ttls, times)
def test_grant_then_check(secret: bytes, chunk: str, op: Op, ttl: float, now: float) -> None:
    cap = grant(secret, chunk, op, ttl, now)
    assert (cap.chunk, cap.op, cap.expires) == (chunk, op, now + ttl)
    check(secret, cap, chunk, op, now)


@pytest.mark.parametrize("codec", [msgspec.msgpack, msgspec.json])
def test_capability_survives_the_wire(codec: Any) -> None:
    cap = grant(SECRET, "ab" * 32, "write", 30.0, NOW + 0.123456789)
    back = codec.decode(codec.encode(cap), type=Capability)
    assert back == cap
    check(SECRET, back, cap.chunk, "write", NOW)


def test_int_times_still_verify_after_the_wire() -> None:
    cap = grant(SECRET, "c", "read", 30, 1_700_000_000)
    assert type(cap.expires) is float
    assert _capability_message("c", "read", 5) == _capability_message("c", "read", 5.0)
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(cap), type=Capability)
    check(SECRET, back, "c", "read", 1_700_000_000)


def test_wire_refuses_an_unknown_op() -> None:
    raw = msgspec.msgpack.encode({"chunk": "c", "op": "admin", "expires": 1.0, "mac": "00"})
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(raw, type=Capability)


_fields = st.sampled_from(["chunk", "op", "expires", "mac"])


@st.composite
def _tampered(draw: st.DrawFn) -> tuple[bytes, Capability, Capability]:
    """A secret, a capability it granted, and a copy with exactly one field changed."""
    secret = draw(secrets_)
    cap = grant(secret, draw(chunks), draw(ops), draw(ttls), NOW)
    field = draw(_fields)
    new: object
    if field == "chunk":
        new = draw(chunks.filter(lambda c: c != cap.chunk))
    elif field == "op":
        new = draw(ops.filter(lambda o: o != cap.op))
    elif field == "expires":
        new = draw(times.filter(lambda t: t != cap.expires))
    else:
        new = draw(st.text("0123456789abcdef", min_size=64, max_size=64) | st.text())
        assume(new != cap.mac)
    return secret, cap, msgspec.structs.replace(cap, **{field: new})


@given(_tampered())
def test_any_tampered_field_is_forged(drawn: tuple[bytes, Capability, Capability]) -> None:
    secret, cap, bad = drawn
    # Asking for exactly what the forgery claims, in time: only the MAC can catch it.
    with pytest.raises(PermissionDenied, match="forged"):
        check(secret, bad, bad.chunk, bad.op, min(NOW, bad.expires - 1))
    # Asking for what the genuine one allows: still "forged", not a lesser complaint.
    with pytest.raises(PermissionDenied, match="forged"):
        check(secret, bad, cap.chunk, cap.op, NOW)
    check(secret, cap, cap.chunk, cap.op, NOW)


def test_another_secret_makes_it_forged() -> None:
    cap = grant(SECRET, "c", "read", 10.0, NOW)
    with pytest.raises(PermissionDenied, match="forged"):
        check(OTHER, cap, "c", "read", NOW)


def test_expiry_boundaries() -> None:
    cap = grant(SECRET, "c", "read", 10.0, NOW)
    check(SECRET, cap, "c", "read", NOW - 3600)  # a node whose clock is behind
    check(SECRET, cap, "c", "read", math.nextafter(cap.expires, -math.inf))
    for late in (cap.expires, math.nextafter(cap.expires, math.inf), cap.expires + 1e6):
        with pytest.raises(PermissionDenied, match="expired"):
            check(SECRET, cap, "c", "read", late)


def test_nan_clock_fails_closed() -> None:
    cap = grant(SECRET, "c", "read", 10.0, NOW)
    with pytest.raises(PermissionDenied, match="expired"):
        check(SECRET, cap, "c", "read", math.nan)


@given(ttls, times, st.floats(min_value=0, max_value=2e6))
def test_valid_exactly_before_expiry(ttl: float, now: float, later: float) -> None:
    cap = grant(SECRET, "c", "read", ttl, now)
    if now + later < cap.expires:
        check(SECRET, cap, "c", "read", now + later)
    else:
        with pytest.raises(PermissionDenied, match="expired"):
            check(SECRET, cap, "c", "read", now + later)


def test_chunk_a_does_not_open_chunk_b() -> None:
    cap = grant(SECRET, "a", "read", 10.0, NOW)
    with pytest.raises(PermissionDenied, match="another chunk"):
        check(SECRET, cap, "b", "read", NOW)
    with pytest.raises(PermissionDenied, match="another chunk"):
        check(SECRET, cap, "a ", "read", NOW)


@pytest.mark.parametrize("granted", OPS)
@pytest.mark.parametrize("asked", OPS)
def test_an_op_opens_only_itself(granted: Op, asked: str) -> None:
    cap = grant(SECRET, "c", granted, 10.0, NOW)
    if granted == asked:
        check(SECRET, cap, "c", asked, NOW)
    else:
        with pytest.raises(PermissionDenied, match="another op"):
            check(SECRET, cap, "c", asked, NOW)


def test_expiry_is_reported_before_chunk_and_op() -> None:
    cap = grant(SECRET, "a", "read", 10.0, NOW)
    with pytest.raises(PermissionDenied, match="expired"):
        check(SECRET, cap, "b", "write", NOW + 60)


@given(chunks, st.text(max_size=10), times, chunks, st.text(max_size=10), times)
def test_mac_message_is_unambiguous(
    c1: str, o1: str, t1: float, c2: str, o2: str, t2: float
) -> None:
    # Decoding it back to the fields proves no two triples share a message.
    message = _capability_message(c1, o1, t1)
    assert msgspec.msgpack.decode(message)[1:] == [c1, o1, t1]
    if (c1, o1, t1) != (c2, o2, t2):
        assert message != _capability_message(c2, o2, t2)


def test_shifted_fields_do_not_verify() -> None:
    cap = grant(SECRET, "abc", "read", 10.0, NOW)
    shifted = Capability("abcread", "read", cap.expires, cap.mac)
    with pytest.raises(PermissionDenied, match="forged"):
        check(SECRET, shifted, "abcread", "read", NOW)


@pytest.mark.parametrize(
    ("op", "ttl", "now", "match"),
    [
        ("admin", 1.0, NOW, "op must be"),
        ("read", 0.0, NOW, "ttl_s"),
        ("read", -1.0, NOW, "ttl_s"),
        ("read", math.inf, NOW, "ttl_s"),
        ("read", math.nan, NOW, "ttl_s"),
        ("read", 1.0, math.inf, "now must be finite"),
        ("read", 1.0, math.nan, "now must be finite"),
    ],
)
def test_grant_refuses_nonsense(op: Any, ttl: float, now: float, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        grant(SECRET, "c", op, ttl, now)


@pytest.mark.parametrize("short", [b"", b"x", b"0123456789abcde"])
def test_short_secrets_are_refused_everywhere(short: bytes) -> None:
    cap = grant(SECRET, "c", "read", 10.0, NOW)
    for call in (
        lambda: client_token(short),
        lambda: check_token(short, ""),
        lambda: grant(short, "c", "read", 1.0, NOW),
        lambda: check(short, cap, "c", "read", NOW),
    ):
        with pytest.raises(InvalidArgument, match="at least 16 bytes"):
            call()


# Where the secret comes from


def test_new_secret_is_random_and_loadable(tmp_path: Path) -> None:
    a, b = new_secret(), new_secret()
    assert a != b
    assert len(a) == 64
    assert load_secret(_secret_file(tmp_path / "s", a + "\n")) == a.encode()


def test_explicit_path_beats_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _secret_file(tmp_path / "explicit", "e" * 20)
    monkeypatch.setenv(ENV_SECRET, "v" * 20)
    monkeypatch.setenv(ENV_SECRET_FILE, str(_secret_file(tmp_path / "env", "f" * 20)))
    assert load_secret(path) == b"e" * 20
    assert load_secret(str(path)) == b"e" * 20


def test_env_secret_beats_env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SECRET, "v" * 20)
    monkeypatch.setenv(ENV_SECRET_FILE, str(_secret_file(tmp_path / "env", "f" * 20)))
    assert load_secret() == b"v" * 20


def test_env_file_when_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SECRET_FILE, str(_secret_file(tmp_path / "env", "  f" * 20 + "\n")))
    assert load_secret() == ("  f" * 20).strip().encode()


def test_empty_env_secret_counts_as_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SECRET, "")
    monkeypatch.setenv(ENV_SECRET_FILE, str(_secret_file(tmp_path / "env", "f" * 20)))
    assert load_secret() == b"f" * 20


def test_secrets_are_taken_verbatim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = new_secret()
    monkeypatch.setenv(ENV_SECRET, f" {text}\n")
    assert load_secret() == text.encode()
    # The same text in a file gives the same key: hex is not decoded.
    assert load_secret(_secret_file(tmp_path / "s", text)) == load_secret()
    monkeypatch.setenv(ENV_SECRET, "correct horse battery staple ü")
    assert load_secret() == "correct horse battery staple ü".encode()


def test_no_secret_anywhere() -> None:
    with pytest.raises(InvalidArgument, match="no cluster secret"):
        load_secret()


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"", "empty"),
        (b" \n\t\n", "empty"),
        (b"short\n", "5 bytes, too short"),
        (b"0123456789abcde", "15 bytes, too short"),
        (b"x" * 5000, "over 4096 bytes"),
    ],
)
def test_bad_secret_files_are_refused(tmp_path: Path, content: bytes, match: str) -> None:
    path = _secret_file(tmp_path / "s", content)
    with pytest.raises(InvalidArgument, match=match):
        load_secret(path)


@pytest.mark.parametrize(("value", "match"), [("   ", "empty"), ("short", "5 bytes, too short")])
def test_bad_env_secrets_are_refused(
    monkeypatch: pytest.MonkeyPatch, value: str, match: str
) -> None:
    monkeypatch.setenv(ENV_SECRET, value)
    with pytest.raises(InvalidArgument, match=rf"\$GRABEN_SECRET is {match}"):
        load_secret()


def test_errors_do_not_leak_the_secret(tmp_path: Path) -> None:
    path = _secret_file(tmp_path / "s", "leaky-secret-text-123", 0o644)
    with pytest.raises(InvalidArgument) as info:
        load_secret(path)
    assert "leaky" not in str(info.value)


def test_missing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(NotFound):
        load_secret(tmp_path / "nope")
    monkeypatch.setenv(ENV_SECRET_FILE, str(tmp_path / "nope"))
    with pytest.raises(NotFound):
        load_secret()


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o610, 0o601, 0o666])
def test_exposed_files_are_refused(tmp_path: Path, mode: int) -> None:
    path = _secret_file(tmp_path / "s", "x" * 32, mode)
    with pytest.raises(InvalidArgument, match=f"group or others \\(mode {mode:04o}\\).*chmod 600"):
        load_secret(path)


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o700])
def test_private_files_are_accepted(tmp_path: Path, mode: int) -> None:
    assert load_secret(_secret_file(tmp_path / "s", "x" * 32, mode)) == b"x" * 32


def test_symlink_is_judged_by_its_target(tmp_path: Path) -> None:
    target = _secret_file(tmp_path / "s", "x" * 32, 0o644)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(InvalidArgument, match="group or others"):
        load_secret(link)
    target.chmod(0o600)
    assert load_secret(link) == b"x" * 32


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_pipe_is_not_held_to_file_modes(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo, 0o666)
    writer = threading.Thread(target=lambda: fifo.write_text("p" * 20 + "\n"), daemon=True)
    writer.start()
    try:
        assert load_secret(fifo) == b"p" * 20
    finally:
        writer.join(timeout=10)
