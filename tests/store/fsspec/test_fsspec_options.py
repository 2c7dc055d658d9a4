"""Storage options and store URLs as ``graben://`` takes them: an option it does not take
is an error naming the ones it does (a dropped ``token_file`` left a job on the
environment's cluster secret, reading outside its tenant's prefix); ``token_file``
is one; a URL it cannot use is an ``InvalidArgument`` naming what is wrong with it.
Against the session's real cluster (with the cluster's secret in the environment,
as on an operator's machine)."""

from __future__ import annotations

import uuid
from pathlib import Path

import fsspec
import pytest

from graben.store import (
    GrabenFileSystem,
    InvalidArgument,
    PermissionDenied,
    connect,
    split_url,
)
from graben.store.cli._main import main


@pytest.fixture(scope="module")
def tenant(cluster_url: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A tenant's root (holding ``mine``) and its token in a 0600 file; beside the root,
    ``ROOT-theirs``, outside it."""
    root = f"/t{uuid.uuid4().hex[:8]}"
    with connect(cluster_url) as operator:
        operator.add_tenant(root[1:], root)
        operator.put(f"{root}/mine", b"the tenant's own")
        operator.put(f"{root}-theirs", b"outside the tenant")
        token = operator.issue_token(root[1:], rights="r", ttl_s=600)
    path = tmp_path_factory.mktemp("token") / "a.token"
    path.write_text(token)
    path.chmod(0o600)
    return root, path


def test_a_token_file_option_is_used_not_the_environments_secret(
    cluster_url: str, tenant: tuple[str, Path]
) -> None:
    root, token_file = tenant
    options = {"token_file": str(token_file), "skip_instance_cache": True}
    with fsspec.open(f"{cluster_url}{root}/mine", "rb", **options) as f:
        assert f.read() == b"the tenant's own"
    fs, _ = fsspec.core.url_to_fs(f"{cluster_url}/", **options)
    with pytest.raises(PermissionDenied):
        fs.cat_file(f"{root}-theirs")
    with pytest.raises(PermissionDenied):
        pd_like_read = fsspec.open(f"{cluster_url}{root}-theirs", "rb", **options)
        with pd_like_read as f:
            f.read()
    with connect(cluster_url, token_file=token_file) as client:  # the Python API takes it too
        assert client.get(f"{root}/mine") == b"the tenant's own"
        with pytest.raises(PermissionDenied):
            client.get(f"{root}-theirs")


def test_pandas_outside_the_prefix_meets_the_refusal_not_a_complaint_about_anon(
    cluster_url: str, tenant: tuple[str, Path]
) -> None:
    """pandas opens a file again with ``anon=True`` after a ``PermissionError``."""
    pd = pytest.importorskip("pandas")
    root, token_file = tenant
    options = {"token_file": str(token_file)}
    with pytest.raises(PermissionDenied, match="reaches"):
        pd.read_csv(f"{cluster_url}{root}-theirs", storage_options=options)


def test_another_filesystems_options_are_left_to_it(
    cluster_url: str, tenant: tuple[str, Path]
) -> None:
    """HF datasets adds ``hf: {...}`` to the storage options it is given; fsspec chains
    put each filesystem's options under its protocol. Neither is a misspelt option."""
    root, token_file = tenant
    options = {"token_file": str(token_file), "hf": {"token": None}, "s3": {"anon": True}}
    with fsspec.open(f"{cluster_url}{root}/mine", "rb", **options) as f:
        assert f.read() == b"the tenant's own"
    with pytest.raises(TypeError, match="'s3'"):  # not a bag of options: a mistake
        fsspec.open(f"{cluster_url}{root}/mine", "rb", s3=True).open()


@pytest.mark.parametrize("option", ["tokne", "token_path", "replicas", "bogus"])
def test_an_unknown_option_is_a_type_error_naming_those_taken(
    cluster_url: str, option: str
) -> None:
    with pytest.raises(TypeError) as caught:
        fsspec.core.url_to_fs(f"{cluster_url}/x", skip_instance_cache=True, **{option: "v"})
    message = str(caught.value)
    assert repr(option) in message and "token_file" in message and "chunk_size" in message
    with pytest.raises(TypeError, match=option):
        GrabenFileSystem(url=cluster_url, skip_instance_cache=True, **{option: "v"})
    if option == "tokne":
        assert "did you mean 'token'" in message


def test_fsspecs_own_options_are_taken(cluster_url: str) -> None:
    fs, _ = fsspec.core.url_to_fs(
        f"{cluster_url}/x", use_listings_cache=False, skip_instance_cache=True, replication=2
    )
    assert isinstance(fs, GrabenFileSystem)


def test_a_token_and_a_token_file_together_are_refused(tenant: tuple[str, Path]) -> None:
    with pytest.raises(InvalidArgument, match="not both"):
        connect("graben://127.0.0.1:1", token="x", token_file=tenant[1])


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("graben://[::1", "IPv6"),
        ("graben://[::1/data", "IPv6"),
        ("graben://user:hunter2@127.0.0.1:7100", "user part"),
        ("graben://127.0.0.1:7100,user:hunter2@127.0.0.2:7100", "user part"),
        ("graben://127.0.0.1:7100?replication=2", "query"),
    ],
)
def test_a_url_graben_cannot_use_says_why(url: str, said: str) -> None:
    for attempt in (
        lambda: connect(url, wait=0.1),
        lambda: fsspec.core.url_to_fs(f"{url}/x", skip_instance_cache=True),
        lambda: GrabenFileSystem(url=url, skip_instance_cache=True),
    ):
        with pytest.raises(InvalidArgument) as caught:
            attempt()
        assert "hunter2" not in str(caught.value)  # a password is never repeated
        assert said in str(caught.value) or "'::'" in str(caught.value), caught.value
    if "[" in url:
        with pytest.raises(InvalidArgument, match="IPv6"):
            split_url(f"{url}/x")


def test_the_cli_says_what_is_wrong_with_a_url_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["ls", "graben://[::1/x"]) == 1
    assert main(["ls", "graben://u:hunter2@127.0.0.1:1/x"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "hunter2" not in err, err
    assert err.count("\n") == 2 and "IPv6" in err and "user part" in err, err
