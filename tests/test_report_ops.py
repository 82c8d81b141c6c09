# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""ds_report says how each op loads: prebuilt into the wheel, JIT-built and cached (upstream's table says "installed
NO" of it), or not built yet."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fork_only


def test_the_extensions_root_is_torchs(tmp_path, monkeypatch):
    from torch.utils.cpp_extension import _get_build_directory
    from deepspeed.gafix.report import extensions_root
    for extensions in (str(tmp_path / "set"), None):
        if extensions:
            monkeypatch.setenv("TORCH_EXTENSIONS_DIR", extensions)
        else:
            monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
        root = extensions_root()
        assert os.path.join(root, "some_op") == _get_build_directory("some_op", verbose=False)
        os.rmdir(os.path.join(root, "some_op"))


def test_each_state_is_told(tmp_path):
    from torch.utils.cpp_extension import LIB_EXT
    from deepspeed.gafix.report import op_state
    from deepspeed.ops.op_builder.all_ops import ALL_OPS
    builder = ALL_OPS["fused_norm"]
    name = builder.jit_name()
    assert op_state(builder, True, str(tmp_path)) == "prebuilt into the wheel"
    assert op_state(builder, False, str(tmp_path)).startswith("not built yet: JIT-built on first use")
    (tmp_path / name).mkdir()
    (tmp_path / name / (name + LIB_EXT)).write_bytes(b"")
    assert op_state(builder, False, str(tmp_path)) == f"JIT-built, cached in {tmp_path / name}"


def test_ds_report_lists_the_ops_unless_their_status_is_hidden(tmp_path):
    ds_report = Path(sys.executable).with_name("ds_report")
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path))
    shown, hidden = (subprocess.run([str(ds_report), *flags], stdout=subprocess.PIPE, text=True, env=env,
                                    timeout=300).stdout for flags in ([], ["--hide_operator_status"]))
    assert "ops, as this install loads them" in shown
    assert "fused_norm ............. not built yet: JIT-built on first use" in shown
    assert "ops, as this install loads them" not in hidden
