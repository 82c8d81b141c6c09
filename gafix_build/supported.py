# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The torch and Python versions the fork is tested on (tools/version-matrix), stated in the wheel's metadata.

torch: from the oldest release upstream's own CI installs (2.7.1) to the newest the package registry serves.
Python: 3.11 to 3.13. The test suite trains through the Hugging Face versions the fork is tested with
(requirements-hf.txt: transformers 5.24.0 requires Python 3.11), so 3.10 cannot run it (upstream's CI only
smoke-tests installing on 3.10); 3.9 is past its end of life and its newest torch is 2.8.0.

The metadata only states the range: the install requirements stay upstream's (``torch>=2.0.0``, no
Requires-Python), so installing the fork in place of upstream never changes a user's torch.
"""

TORCH = ("2.7.1", "2.15.0")
PYTHON = ("3.11", "3.12", "3.13")


def tested_range():
    """One line for people: 'torch 2.7.1 to 2.15.0, Python 3.11 to 3.13'."""
    return f"torch {TORCH[0]} to {TORCH[-1]}, Python {PYTHON[0]} to {PYTHON[-1]}"


def with_supported_versions(setup):
    """``setup`` whose Python classifiers are the tested Pythons and whose summary names the tested range."""

    def setup_with_versions(**kwargs):
        others = [c for c in kwargs.get("classifiers") or [] if not c.startswith("Programming Language :: Python")]
        python = [f"Programming Language :: Python :: {version}" for version in PYTHON]
        summary = f"{kwargs.get('description') or 'DeepSpeed library'} (deepspeed-gafix, tested on {tested_range()})"
        return setup(**dict(kwargs, classifiers=python + others, description=summary))

    return setup_with_versions
