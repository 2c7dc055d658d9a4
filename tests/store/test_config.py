"""Server flags from a TOML file (``--config``): real processes, and the parser alone."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from graben.store import InvalidArgument, connect
from graben.store.cli._configfile import config_defaults, load_config
from graben.store.cli._main import apply_config, build_parser
from graben.store.local import stop

GRABEN = (sys.executable, "-m", "graben.store.cli")


def test_a_cluster_starts_from_a_config_file_alone(tmp_path: Path) -> None:
    config = tmp_path / "graben.toml"
    config.write_text(
        f"""
[cluster]
root = "{tmp_path / "cluster"}"
nodes = 3
port = 0                      # any free ports: tests run side by side
secret-file = "{os.environ["GRABEN_SECRET_FILE"]}"

[meta]
repair-interval = 1.5

[node]
scrub-interval = 600
"""
    )
    proc = subprocess.Popen(
        [*GRABEN, "cluster", "up", "--config", str(config)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("graben://127.0.0.1:")
        with connect(url) as client:
            assert sum(n.alive for n in client.health().nodes) == 3
            assert client.health().replication == 3
            client.put("/from-config", b"x" * 100_000)
            assert client.get("/from-config") == b"x" * 100_000
    finally:
        stop([proc])
    assert sorted(p.name for p in (tmp_path / "cluster").glob("node*")) == [
        "node0",
        "node1",
        "node2",
    ]


def test_flags_on_the_command_line_override_the_file(tmp_path: Path) -> None:
    config = tmp_path / "graben.toml"
    config.write_text(
        '[node]\ndata = "/from/file"\nmeta = "10.0.0.1:7100"\nrack = "r1"\nlisten = "0.0.0.0"\n'
        "scrub_interval = 60\n"
    )
    argv = ["node", "serve", "--config", str(config), "--rack", "r2"]
    parser = build_parser("node")
    apply_config(parser, argv)
    args = parser.parse_args(argv)
    assert args.data == Path("/from/file")  # a required flag, given by the file
    assert args.meta == (("10.0.0.1", 7100),)  # parsed as the flag parses it
    assert args.listen == ("0.0.0.0", None)
    assert args.scrub_interval == 60.0
    assert args.rack == "r2"  # the command line wins


def test_the_rebalance_rate_comes_from_the_file_as_a_size(tmp_path: Path) -> None:
    config = tmp_path / "graben.toml"
    config.write_text('[meta]\nengine = "/m.db"\nrebalance-rate = "4M"\n')
    argv = ["meta", "serve", "--config", str(config)]
    parser = build_parser("meta")
    apply_config(parser, argv)
    assert parser.parse_args(argv).rebalance_rate == 4 << 20
    assert parser.parse_args([*argv, "--rebalance-rate", "0"]).rebalance_rate == 0


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ('listn = "1.2.3.4:7100"', "unknown key 'listn'"),
        ('listen = "no port here:"', "listen"),
        ('init = "yes"', "true or false"),
        ("replication = [1, 2]", "replication"),
    ],
)
def test_a_bad_key_is_refused_naming_the_key_and_the_file(
    tmp_path: Path, table: str, says: str
) -> None:
    config = tmp_path / "graben.toml"
    config.write_text(f"[meta]\nengine = 'sqlite:///{tmp_path}/m.db'\n{table}\n")
    result = subprocess.run(
        [*GRABEN, "meta", "serve", "--config", str(config)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert says in result.stderr and str(config) in result.stderr and "[meta]" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "m.db").exists()


def test_a_missing_or_broken_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such config file"):
        load_config(tmp_path / "nope.toml", "meta")
    broken = tmp_path / "broken.toml"
    broken.write_text("[meta\n")
    with pytest.raises(InvalidArgument, match="not valid TOML"):
        load_config(broken, "meta")
    broken.write_text("meta = 3\n")
    with pytest.raises(InvalidArgument, match="must be a table"):
        load_config(broken, "meta")


def test_every_flag_of_a_command_can_come_from_the_file() -> None:
    parser = build_parser("meta")
    leaf = parser._subparsers._group_actions[0].choices["meta"]  # type: ignore[union-attr]
    serve = leaf._subparsers._group_actions[0].choices["serve"]
    flags = [o[2:] for a in serve._actions for o in a.option_strings if o.startswith("--")]
    values = {f: True for f in flags if f not in ("help", "config")}
    with pytest.raises(
        InvalidArgument
    ) as refused:  # True fits only switches: so every key was known
        config_defaults(serve, values, "x.toml [meta]")
    assert "unknown key" not in str(refused.value)


def test_the_example_file_in_the_docs_is_one_every_server_accepts() -> None:
    page = (Path(__file__).parents[2] / "docs" / "cluster.md").read_text()
    example = page.split("```toml\n", 1)[1].split("```", 1)[0]
    for command, argv in (
        ("meta", ["meta", "serve"]),
        ("node", ["node", "serve"]),
        ("cluster", ["cluster", "up"]),
    ):
        parser = build_parser(command)
        leaf = parser._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
        action = leaf._subparsers._group_actions[0].choices[argv[1]]
        config_defaults(action, tomllib.loads(example)[command], f"docs [{command}]")


def test_the_s3_tier_takes_aws_settings_from_the_environment_then_the_shared_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from graben.store._config import aws_settings

    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_PROFILE",
    ):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "credentials").write_text(
        "[default]\naws_access_key_id = d\naws_secret_access_key = ds\n"
        "[train]\naws_access_key_id = t\naws_secret_access_key = ts\n"
    )
    (tmp_path / "config").write_text(
        "[default]\nregion = eu-west-1\n[profile train]\nregion = us-east-2\n"
        "endpoint_url = http://127.0.0.1:9000\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    assert aws_settings() == {"key": "d", "secret": "ds", "region": "eu-west-1"}
    monkeypatch.setenv("AWS_PROFILE", "train")
    assert aws_settings() == {
        "key": "t",
        "secret": "ts",
        "region": "us-east-2",
        "endpoint": "http://127.0.0.1:9000",
    }
    monkeypatch.setenv("AWS_REGION", "ap-south-1")  # the environment wins
    assert aws_settings()["region"] == "ap-south-1"
    (tmp_path / "config").write_text("not [an ini")
    assert aws_settings()["key"] == "t"  # a broken file is passed over
