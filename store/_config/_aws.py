"""AWS settings: the dataset door's S3 fetches (``aws_environment``) and the servers'
S3 tier (``aws_settings``: the shared files too)."""

from __future__ import annotations

import configparser
from pathlib import Path

from ._env import env

AWS_VARIABLES = {
    "key": "AWS_ACCESS_KEY_ID",
    "secret": "AWS_SECRET_ACCESS_KEY",
    "token": "AWS_SESSION_TOKEN",
    "region": "AWS_REGION",
    "endpoint": "AWS_ENDPOINT_URL",
    "profile": "AWS_PROFILE",
}


def aws_environment() -> dict[str, str]:
    """The AWS settings an S3 client takes from the environment (``AWS_REGION``, else
    ``AWS_DEFAULT_REGION``): the dataset door's own S3 client uses them only where
    s3fs would use the same (see ``graben.dataloader``'s ``_s3``)."""
    found = {name: env(variable) or "" for name, variable in AWS_VARIABLES.items()}
    found["region"] = found["region"] or env("AWS_DEFAULT_REGION") or ""
    return {name: value for name, value in found.items() if value}


def aws_settings() -> dict[str, str]:
    """The AWS settings a data node's or metadata service's S3 tier uses: the environment
    (``aws_environment``) first, then the shared files, ``$AWS_SHARED_CREDENTIALS_FILE``
    (else ``~/.aws/credentials``) and ``$AWS_CONFIG_FILE`` (else ``~/.aws/config``), in
    the profile ``$AWS_PROFILE`` names, else ``default``. Keys as ``aws_environment``'s."""
    found = aws_environment()
    profile = found.pop("profile", "default")
    home = Path.home() / ".aws"
    shared = env("AWS_SHARED_CREDENTIALS_FILE") or str(home / "credentials")
    config = env("AWS_CONFIG_FILE") or str(home / "config")
    files = {
        **_ini_section(config, profile if profile == "default" else f"profile {profile}"),
        **_ini_section(shared, profile),
    }
    names = {
        "aws_access_key_id": "key",
        "aws_secret_access_key": "secret",
        "aws_session_token": "token",
        "region": "region",
        "endpoint_url": "endpoint",
    }
    from_files = {names[k]: v for k, v in files.items() if k in names and v}
    return {**from_files, **found}


def _ini_section(path: str, section: str) -> dict[str, str]:
    """One section of an INI file (AWS's shared files), empty if either is missing."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (OSError, configparser.Error):
        return {}
    return dict(parser[section]) if parser.has_section(section) else {}
