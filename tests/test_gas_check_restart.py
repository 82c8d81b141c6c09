# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""ds_gas_check --restart: a run saved on one number of ranks, resumed on another with the same global batch, checked
step by step against the fp64 reference of the run that never stopped; its control (a resume that loses the
optimizer states) and the refusals of what it cannot check."""

import json
from pathlib import Path

import pytest

from helpers.gas_check_cli import ds_gas_check

pytestmark = pytest.mark.fork_only  # the command is the fork's

# AdamW, a warm-up schedule and active clipping: the optimizer's moments and step, the schedule's position and the
# clip all have to cross the restart for the steps after it to match.
ADAMW_WARMUP_CLIP = {
    "zero_optimization": {
        "stage": 2
    },
    "optimizer": {
        "type": "AdamW",
        "params": {
            "lr": 1e-3,
            "weight_decay": 0.01,
            "torch_adam": True
        }
    },
    "scheduler": {
        "type": "WarmupLR",
        "params": {
            "warmup_min_lr": 1e-4,
            "warmup_max_lr": 1e-3,
            "warmup_num_steps": 4
        }
    },
    "gradient_clipping": 0.5,
}
RESHARD = {"checkpoint": {"reshard_on_load": True}}


def write_config(tmp_path, **config):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    return str(path)


def restart_check(tmp_path, extensions_dir, config, args, returncode):
    """``ds_gas_check --config <config> <args> --json``: the finished process (its exit status ``returncode``) and
    its JSON results."""
    results = tmp_path / "results.json"
    proc = ds_gas_check(["--config", write_config(tmp_path, **config), *args, "--json",
                         str(results)], extensions_dir, tmp_path)
    assert proc.returncode == returncode, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc, json.loads(results.read_text())


def test_resumes_on_fewer_ranks_as_the_run_that_never_stopped(tmp_path, extensions_dir):
    """2 ranks (8 x 2) save after step 2; 1 rank (8 x 4) loads it and trains steps 3 and 4."""
    proc, found = restart_check(tmp_path, extensions_dir, {
        **ADAMW_WARMUP_CLIP,
        **RESHARD
    }, ["--ranks", "2", "--restart", "1", "--steps", "4"], 0)
    assert "resumed after step 2 from the checkpoint split 8 x 2 x 2 saved" in proc.stdout
    assert "update error step 3 | step 4" in proc.stdout
    (saved, ), (resumed, ) = found["saved"], found["resumed"]
    assert (saved["name"], saved["passed"], len(saved["update_errors"])) == ("8 x 2 x 2", True, 2)
    assert (resumed["name"], resumed["passed"], resumed["first_step"]) == ("8 x 4 x 1", True, 3)
    assert len(resumed["update_errors"]) == len(resumed["norms"]) == 2
    assert resumed["restored_error"] <= resumed["tolerance"]
    # Within fp32's rounding, as Adam amplifies it on this model (the tolerance is raised to 10 x plain PyTorch's).
    assert max(resumed["update_errors"]) <= min(resumed["tolerance"], 1e-4), resumed
    assert not list(tmp_path.glob("ds_gas_check_restart_*")), "the temporary checkpoint is removed"


def test_control_a_resume_without_optimizer_states_fails(tmp_path, extensions_dir):
    """The weights load right and the first step after them does not: the check fails that step."""
    _, found = restart_check(tmp_path, extensions_dir, ADAMW_WARMUP_CLIP, [
        "--model", "helpers.lossy_resume:make_model", "--restart", "1", "--steps", "3", "--restart-after", "2",
        "--checkpoint-dir",
        str(tmp_path / "ckpt")
    ], 1)
    resumed = found["resumed"][0]
    assert resumed["verdict"] == "FAIL"
    assert resumed["restored_error"] <= resumed["tolerance"]
    assert resumed["update_errors"][0] > 100 * resumed["tolerance"], resumed
    assert (tmp_path / "ckpt" / "latest").read_text() == "global_step2", "--checkpoint-dir is kept"


def test_another_number_of_ranks_without_reshard_on_load_is_refused_before_training(tmp_path, extensions_dir):
    proc = ds_gas_check(
        ["--config", write_config(tmp_path, **ADAMW_WARMUP_CLIP), "--ranks", "2", "--restart", "1"], extensions_dir,
        tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "ds_gas_check: error: --restart 1: a checkpoint saved on 2 rank(s) resumed on 1: ZeRO stage 2" in proc.stderr
    assert '"checkpoint": {"reshard_on_load": true}' in proc.stderr
    assert "split" not in proc.stdout, "nothing trained"


@pytest.mark.slow
def test_another_number_of_ranks_without_reshard_on_load_is_the_engine_refusing(tmp_path, extensions_dir, monkeypatch):
    """Past the pre-flight (as a launch under --restart is), the engine's own refusal is the check's finding."""
    monkeypatch.setenv("DS_GAS_CHECK_PREFLIGHT_DONE", "1")
    proc, found = restart_check(tmp_path, extensions_dir, ADAMW_WARMUP_CLIP,
                                ["--ranks", "2", "--restart", "1", "--steps", "2"], 1)
    assert "ds_gas_check --restart: FAIL: the engine could not resume from" in proc.stderr
    assert "reshard_on_load" in proc.stderr
    assert found["saved"][0]["passed"] and "reshard_on_load" in found["resumed"]["error"], found


@pytest.mark.parametrize("args, message", [
    (["--restart", "2", "--splits", "8x2,4x4"], "--restart checks one split before the restart (--splits MxG)"),
    (["--restart", "3", "--ranks", "2"
      ], "--restart 3: the global batch of 32 (8x2 on 2 rank(s)) does not divide into 3"),
    (["--restart", "4", "--splits", "16x1"
      ], "--restart 4: each rank's share of the global batch (4) is not a multiple of the "
     "micro-batch 16: give --restart-split MxG (M x G = 4)"),
    (["--restart", "1", "--ranks", "2", "--restart-split", "4x2"], "--restart-split 4x2: one split whose micro-batch "
     "x GAS is 32"),
    (["--restart", "1", "--steps", "3", "--restart-after", "3"], "--restart-after 3: the save must follow a step "
     "before the last of --steps 3 (1 to 2)"),
    (["--restart", "1", "--no-reference"], "--restart and --no-reference"),
    (["--restart", "1", "--pipeline-stages", "2"], "--restart and --pipeline-stages"),
    (["--restart", "1", "--items", "variable", "--restart-split", "4x4"], None),
])
def test_bad_input_names_the_option(tmp_path, capsys, monkeypatch, args, message):
    # In this process: each is refused before a rank starts.
    from deepspeed.gafix.gas_check.cli import main
    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    config = write_config(tmp_path)
    if message is None:  # variable items in mean mode: another micro-batch trains another objective
        message = "--restart-split 4x4 changes the micro-batch (8 to 4): each micro-batch's loss is the mean"
    assert main(["--config", config, *args]) == 2
    assert f"ds_gas_check: error: {message}" in capsys.readouterr().err


def test_not_under_a_launcher(tmp_path, capsys, monkeypatch):
    from deepspeed.gafix.gas_check.cli import main
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["--config", write_config(tmp_path), "--restart", "1"]) == 2
    assert "--restart launches its two runs itself" in capsys.readouterr().err


@pytest.mark.parametrize("statuses, saved, resumed", [
    ([2], "the save launch exited 2 before writing its results", "not run: the run before the restart did not pass "
     "(exit 2)"),
    ([0, 1], None, "the resume launch exited 1 before writing its results"),
])
def test_json_says_why_a_launch_has_no_results(tmp_path, statuses, saved, resumed):
    # No launch: each stands in with its exit status; the save's results exist when it exited 0.
    from argparse import Namespace
    from deepspeed.gafix.gas_check.restart import RestartPlan, run_both
    plan = RestartPlan(ranks_before=2, before=(8, 2), ranks_after=1, after=(8, 4), step=2)
    results = tmp_path / "results.json"
    exits = iter(statuses)

    def launch(argv, ranks):
        status = next(exits)
        if status == 0:
            Path(argv[argv.index("--json") + 1]).write_text(json.dumps([{"passed": True}]))
        return status

    args = Namespace(checkpoint_dir=None, json=str(results))
    assert run_both(args, [], plan, launch) == max(statuses)
    found = json.loads(results.read_text())
    assert found["saved"] == [{"passed": True}] if saved is None else saved in found["saved"]["error"], found
    assert resumed in found["resumed"]["error"], found
