# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""A client's resume on fewer processes, as tests/test_hf_resume.py and tests/test_accelerate_resume.py run it: the
worker's run from the start on 2 processes (it saves), then its run resumed from that save on 1, per ZeRO stage, and
what the resumed run must share with the one that never stopped."""

import pytest

from toolkit.launch import launch_cases
from helpers.selection import selected_params


def written_and_resumed(worker, root, extensions_dir, request):
    """``stage -> (each writer rank's result, (the resumed run's result, ))`` for the stages the tests selected."""
    stages = ",".join(str(stage) for stage in selected_params(request, "stage", "runs"))
    common = ["--root", str(root), "--stages", stages]
    written = launch_cases(worker,
                           2,
                           extensions_dir=extensions_dir,
                           timeout=1200,
                           extra_args=common + ["--uninterrupted"])
    resumed = launch_cases(worker,
                           1,
                           extensions_dir=extensions_dir,
                           timeout=1200,
                           extra_args=common + ["--resume-from", "2"])
    return lambda stage: (written.case(f"uninterrupted/zero{stage}"), resumed.case(f"resume-from2/zero{stage}"))


def assert_resumed_where_saved(written, resumed, steps, save_steps, client):
    """The writer's ranks agree; the resumed run started at the save and ends at ``steps`` with the writer's learning
    rate. Returns the uninterrupted run's result."""
    assert all(rank["weights"] == written[0]["weights"] for rank in written), "the writer's ranks disagree"
    uninterrupted = written[0]
    assert resumed["resumed_at"] == save_steps, f"{client} resumed at step {resumed['resumed_at']}"
    assert resumed["global_step"] == uninterrupted["global_step"] == steps
    assert resumed["lr"] == pytest.approx(uninterrupted["lr"], rel=1e-12)
    return uninterrupted
