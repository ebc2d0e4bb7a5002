"""Checking a manifest's fields one by one (`Fields`): the patterns each value must match, secrets in
URLs, and the manifest's UTC time stamps.
"""

import datetime
import re
from collections.abc import Sequence
from typing import Any

from builder.node.contract import ManifestError


class Fields:
    """Typed access to one JSON object; every failure names the file and the field."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, dict):
            raise ManifestError(f"{where} is not a JSON object", "re-publish the wheelhouse")
        self.data: dict[str, Any] = data
        self.where = where

    def fail(self, key: str, why: str) -> "ManifestError":
        return ManifestError(f"{self.where}: field {key!r} {why}", "the file was edited or damaged: re-publish it")

    def get(self, key: str, kind: "type | tuple[type, ...]", optional: bool = False) -> Any:
        if key not in self.data:
            if optional:
                return None
            raise self.fail(key, "is missing")
        value = self.data[key]
        if value is None and optional:
            return None
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(key, f"has the wrong type ({type(value).__name__})")
        return value

    def text(self, key: str, pattern: "re.Pattern[str] | None" = None, optional: bool = False) -> Any:
        value = self.get(key, str, optional)
        if value is not None and pattern is not None and not pattern.fullmatch(value):
            raise self.fail(key, f"is not valid: {value[:80]!r}")
        return value

    def choice(self, key: str, choices: "Sequence[str]") -> str:
        value: str = self.get(key, str)
        if value not in choices:
            raise self.fail(key, f"is {value[:40]!r}, not one of {', '.join(choices)}")
        return value

    def texts(self, key: str, pattern: "re.Pattern[str]", optional: bool = False) -> "tuple[str, ...]":
        value = self.get(key, list, optional)
        if value is None:
            return ()
        for item in value:
            if not isinstance(item, str) or not pattern.fullmatch(item):
                raise self.fail(key, f"holds an invalid item {str(item)[:80]!r}")
        return tuple(value)

    def table(self, key: str, optional: bool = False) -> "dict[str, Any]":
        value = self.get(key, dict, optional)
        return value if value is not None else {}

    def size(self, key: str, limit: int) -> "int | None":
        """An optional size in bytes: a whole number from 1 to `limit`."""
        value: int | None = self.get(key, int, optional=True)
        if value is not None and not 0 < value <= limit:
            raise self.fail(key, f"is {value if abs(value) < 1 << 64 else 'out of range'}, not a size from 1 "
                                 f"to {limit} bytes")  # fmt: skip
        return value


VERSION_RE = re.compile(r"^[A-Za-z0-9.+!_-]{1,80}$")
ID_RE = re.compile(r"^[0-9a-f]{32}$")
KEY_LINE_RE = re.compile(r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com) "
                         r"[A-Za-z0-9+/]{20,1400}={0,2}$")  # fmt: skip
CUDA_RE = re.compile(r"^\d{1,2}\.\d{1,2}(\.\d+)?$")
# A torch build as PyTorch's indexes name it (cpu, cu126, cu130), and where one comes from: an index URL.
TORCH_VARIANT_RE = re.compile(r"^(cpu|cu[1-9][0-9][0-9])$")
# An index URL: printable, no credentials (user:TOKEN@host or ?token=... would be printed, logged and embedded).
INDEX_URL_RE = re.compile(r"^(https?|file)://(?![^/]*@)[^\s\x00-\x1f\x7f?#]{1,400}$")


def url_secret(url: str) -> "str | None":
    """What in `url` may be a secret, in words (None: nothing): a user name or password, a query
    string (?token=..., a signed URL's signature) or a fragment. None of them belongs in a package
    index's or a wheelhouse's URL, and each would be printed, logged and embedded where the URL goes."""
    rest = url.partition("://")[2] if "://" in url else ""
    if "@" in rest.partition("/")[0]:
        return "a user name or password (user:TOKEN@host)"
    if "?" in url:
        return "a query string (?token=..., a signed URL's signature)"
    if "#" in url:
        return "a fragment (#...)"
    return None


def link_secret(url: str) -> "str | None":
    """url_secret for a link people follow (a known failure's issue): a fragment (#issuecomment-1) is
    an anchor in a page, not a secret; a user name, password or query string is."""
    secret = url_secret(url)
    return None if secret is not None and secret.startswith("a fragment") else secret


def torch_variant(cuda: "str | None") -> str:
    """The build of a torch as PyTorch's indexes name it: cpu, cu126 (CUDA 12.6), cu130."""
    if not cuda:
        return "cpu"
    major, minor = cuda.split(".")[:2]
    return f"cu{major}{minor}"


GLIBC_RE = re.compile(r"^\d{1,2}\.\d{1,3}$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
STAMP_RE = re.compile(r"^[0-9T:+.\-Z ]{0,40}$")


def parse_stamp(text: str) -> "datetime.datetime | None":
    """A UTC time as the manifest writes it (2026-12-22T10:00:00Z), or None."""
    try:
        when = datetime.datetime.strptime(text.replace("+00:00", "Z"), "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return when.replace(tzinfo=datetime.timezone.utc)


def stamp(when: "datetime.datetime") -> str:
    return when.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
