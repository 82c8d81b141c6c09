# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The Hugging Face test modules need transformers and accelerate: without them a module is skipped, or fails where
DS_GAFIX_REQUIRE_HF=1 (CI) says they must be there."""

import importlib.util
import os

import pytest


def require_transformers_and_accelerate():
    """Call at a test module's top."""
    missing = [name for name in ("transformers", "accelerate") if importlib.util.find_spec(name) is None]
    if not missing:
        return
    if os.environ.get("DS_GAFIX_REQUIRE_HF") == "1":
        raise ImportError(f"DS_GAFIX_REQUIRE_HF=1 but {', '.join(missing)} not installed: "
                          "pip install -r tests/requirements.txt")
    pytest.skip(f"{', '.join(missing)} not installed (pip install -r tests/requirements.txt)", allow_module_level=True)
