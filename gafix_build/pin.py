# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The upstream pin: which ``deepspeed`` sdist the fork is built from, and its sha256."""

import json
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import BuildError

PIN_FILE = "upstream.json"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*([a-z]+[0-9]+)?$")


@dataclass(frozen=True)
class Pin:
    package: str
    version: str
    sha256: str

    @property
    def requirement(self):
        return f"{self.package}=={self.version}"

    @property
    def sdist_name(self):
        return f"{self.package}-{self.version}.tar.gz"


def load_pin(repo_root):
    """Read and validate ``upstream.json`` in ``repo_root``."""
    path = Path(repo_root) / PIN_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise BuildError(f"{path}: pin file missing") from None
    except json.JSONDecodeError as err:
        raise BuildError(f"{path}: not valid JSON ({err})") from None
    for key in ("package", "version", "sha256"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise BuildError(f"{path}: key '{key}' missing or not a non-empty string")
    if data["package"] != "deepspeed":
        raise BuildError(f"{path}: key 'package' must be 'deepspeed', got '{data['package']}'")
    if not _VERSION.match(data["version"]):
        raise BuildError(f"{path}: key 'version' is not a release version: '{data['version']}'")
    if not _SHA256.match(data["sha256"]):
        raise BuildError(f"{path}: key 'sha256' must be 64 lowercase hex digits")
    return Pin(package=data["package"], version=data["version"], sha256=data["sha256"])
