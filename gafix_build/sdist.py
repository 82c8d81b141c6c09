# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Obtain the pinned upstream sdist: a local file, the cache, or ``pip download``; always hash-checked."""

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from .errors import BuildError

LOCAL_SDIST_VAR = "DS_GAFIX_UPSTREAM_SDIST"
CACHE_DIR_VAR = "DS_GAFIX_CACHE_DIR"


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_dir(environ=os.environ):
    if environ.get(CACHE_DIR_VAR):
        return Path(environ[CACHE_DIR_VAR])
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "deepspeed-gafix"


def _verify(path, pin, what):
    actual = sha256_of(path)
    if actual != pin.sha256:
        raise BuildError(f"sha256 mismatch for {what}: got {actual}, "
                         f"upstream.json pins {pin.requirement} at {pin.sha256}")


def _download(pin, dest_dir):
    """Fetch the sdist with pip from whatever index pip is configured to use."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--disable-pip-version-check",
        "--dest",
        str(dest_dir), pin.requirement
    ]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    found = list(Path(dest_dir).glob(f"{pin.package}-{pin.version}.tar.gz"))
    if proc.returncode != 0 or not found:
        tail = " | ".join(proc.stdout.strip().splitlines()[-3:])
        raise BuildError(f"'pip download {pin.requirement}' failed (exit {proc.returncode}): {tail}; "
                         f"offline? set {LOCAL_SDIST_VAR}=/path/to/{pin.sdist_name}")
    return found[0]


def obtain_sdist(pin, environ=os.environ):
    """Return the path of a verified copy of the pinned sdist.

    ``DS_GAFIX_UPSTREAM_SDIST`` names a local file (air-gapped clusters); otherwise the sdist is taken
    from the cache, or downloaded with pip, verified, and cached. A hash mismatch is an error either way.
    """
    local = environ.get(LOCAL_SDIST_VAR)
    if local:
        path = Path(local)
        if not path.is_file():
            raise BuildError(f"{LOCAL_SDIST_VAR}={local}: no such file")
        _verify(path, pin, f"{LOCAL_SDIST_VAR}={local}")
        return path

    cached = cache_dir(environ) / pin.sha256 / pin.sdist_name
    if cached.is_file():
        _verify(cached, pin, f"cached {cached}")
        return cached

    cached.parent.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cached.parent.parent) as tmp:
        fetched = _download(pin, tmp)
        _verify(fetched, pin, f"{pin.sdist_name} from pip download")
        cached.parent.mkdir(exist_ok=True)
        # Atomic: a concurrent build sees either no file or the whole, verified one.
        os.replace(fetched, cached)
    return cached


def extract_sdist(sdist, dest):
    """Unpack ``sdist`` so that its top directory's contents land directly in ``dest``."""
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        try:
            with tarfile.open(sdist, "r:gz") as tar:
                # The 'data' filter refuses absolute paths, links out of the tree and device files.
                extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                tar.extractall(tmp, **extra)
        except (tarfile.TarError, OSError) as err:
            raise BuildError(f"cannot unpack {sdist}: {err}") from None
        tops = os.listdir(tmp)
        if len(tops) != 1:
            raise BuildError(f"{sdist}: expected one top-level directory, found {len(tops)}")
        os.replace(os.path.join(tmp, tops[0]), dest)
    return dest
