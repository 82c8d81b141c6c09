# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""``patches/series``: the ordered list of patches to upstream files."""

import email.parser
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import BuildError

SERIES_FILE = "patches/series"
_PATCH_PREFIX = re.compile(r"^\[PATCH[^\]]*\]\s*")


@dataclass(frozen=True)
class Patch:
    path: Path
    subject: str

    @property
    def name(self):
        return self.path.name


def patch_subject(path):
    """The one-line subject of a git format-patch file, without its ``[PATCH]`` prefix."""
    with open(path, encoding="utf-8", errors="replace") as f:
        head = []
        for line in f:
            if line.startswith("---") or line.startswith("diff --git"):
                break
            head.append(line)
    headers = email.parser.Parser().parsestr("".join(head), headersonly=True)
    subject = headers.get("Subject")
    if not subject:
        raise BuildError(f"{path}: no 'Subject:' header; patches must be in git format-patch form")
    return _PATCH_PREFIX.sub("", " ".join(subject.split()))


def read_series(repo_root):
    """The patches of ``patches/series`` in order; every ``patches/*.patch`` must be listed exactly once."""
    patches_dir = Path(repo_root) / "patches"
    series = Path(repo_root) / SERIES_FILE
    if not series.is_file():
        raise BuildError(f"{series}: series file missing")
    names = []
    for number, raw in enumerate(series.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if "/" in line or not line.endswith(".patch"):
            raise BuildError(f"{series}:{number}: '{line}' is not a file name ending in .patch")
        if line in names:
            raise BuildError(f"{series}:{number}: '{line}' listed twice")
        if not (patches_dir / line).is_file():
            raise BuildError(f"{series}:{number}: patches/{line} does not exist")
        names.append(line)
    unlisted = sorted(p.name for p in patches_dir.glob("*.patch") if p.name not in names)
    if unlisted:
        raise BuildError(f"{series}: patches/{unlisted[0]} is not listed (list it or delete it)")
    return [Patch(path=patches_dir / name, subject=patch_subject(patches_dir / name)) for name in names]
