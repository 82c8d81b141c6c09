# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""ds_gas_check: check a DeepSpeed config for gradient-accumulation invariance before a long run.

Trains one global batch (and a few steps) under several micro-batch x GAS splits and compares each
with a plain fp64 PyTorch run from the same weights: the engine's reported global grad norm and
the fp32 master-weight update after the first and the last step. Exit status 0 only when every
split passes; 1 when one fails (with a diagnosis); 2 for bad input.

  ds_gas_check --config ds_config.json                    # 1 rank, in this process
  ds_gas_check --config ds_config.json --ranks 2          # 2 ranks through the deepspeed launcher
  deepspeed --num_gpus 2 --no_local_rank --module deepspeed.gafix.gas_check --config ds_config.json
"""

import argparse
import json
import os
import socket
import subprocess
import sys

OPTIMIZER_PRESETS = {
    "sgd": {
        "type": "SGD",
        "params": {
            "lr": 0.1
        }
    },
    # torch's AdamW (torch_adam): no JIT build of DeepSpeed's fused Adam needed for a check.
    "adamw": {
        "type": "AdamW",
        "params": {
            "lr": 1e-3,
            "weight_decay": 0.0,
            "torch_adam": True
        }
    },
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="ds_gas_check",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="DeepSpeed config file (JSON)")
    parser.add_argument("--model",
                        help="model factory 'module:function' (no arguments; maps [batch, 8] floats to "
                        "[batch, 4]); default: a small built-in MLP")
    parser.add_argument("--splits",
                        default="16x1,8x2,4x4,2x8",
                        help="per-rank micro-batch x GAS splits of the same batch (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps compared (default: %(default)s)")
    parser.add_argument("--optimizer",
                        default="config",
                        choices=["config", *OPTIMIZER_PRESETS],
                        help="the config's optimizer section (default; SGD lr 0.1 when it has none), or a preset")
    parser.add_argument("--pipeline-stages",
                        type=int,
                        default=0,
                        help="check the pipeline engine: a built-in PipelineModule with this many stages, "
                        "trained with train_batch()")
    parser.add_argument("--loop",
                        default="step_every_micro_batch",
                        choices=["step_every_micro_batch", "boundary", "step_once"],
                        help="training loop: backward()+step() on every micro-batch (default); "
                        "set_gradient_accumulation_boundary() and one step() per batch, as accelerate does; or "
                        "one step() per batch, for managed_gradient_accumulation: false")
    parser.add_argument("--ranks", type=int, default=1, help="ranks to launch when not under a launcher")
    parser.add_argument("--json", help="also write the results to this JSON file (rank 0)")
    return parser.parse_args(argv)


def parse_splits(text):
    try:
        splits = [tuple(int(n) for n in item.lower().split("x")) for item in text.split(",")]
    except ValueError:
        splits = []
    if not splits or any(len(s) != 2 or min(s) < 1 for s in splits):
        raise ValueError(f"--splits '{text}': expected e.g. 16x1,8x2 (micro-batch x GAS, per rank)")
    return splits


def load_config(path, optimizer):
    try:
        with open(path) as f:
            config = json.load(f)
    except OSError as err:
        raise ValueError(f"--config {path}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"--config {path}: not valid JSON: {err}") from None
    if not isinstance(config, dict):
        raise ValueError(f"--config {path}: expected a JSON object")
    notes = []
    if optimizer != "config":
        config["optimizer"] = OPTIMIZER_PRESETS[optimizer]
    elif "optimizer" not in config:
        config["optimizer"] = OPTIMIZER_PRESETS["sgd"]
        notes.append("config has no 'optimizer' section: checked with SGD, lr 0.1")
    if "scheduler" in config:
        notes.append("config key 'scheduler' left out: the reference keeps the learning rate constant")
        config.pop("scheduler")
    return config, notes


def under_launcher():
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def relaunch(argv, ranks):
    """Run this check on ``ranks`` ranks through the deepspeed launcher; return its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    cmd = [
        sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus",
        str(ranks), "--no_local_rank", "--master_port",
        str(free_port()), "--module", "deepspeed.gafix.gas_check", *args
    ]
    return subprocess.call(cmd)


def single_process_env():
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", str(free_port()))):
        os.environ.setdefault(key, value)


def main(argv=None):
    args = parse_args(argv)
    try:
        splits = parse_splits(args.splits)
        config, notes = load_config(args.config, args.optimizer)
        from .models import builtin_model, load_model_factory
        make_model = load_model_factory(args.model) if args.model else builtin_model
        if args.model and args.pipeline_stages:
            raise ValueError("--model and --pipeline-stages: the pipeline check uses its built-in model")
    except ValueError as err:
        print(f"ds_gas_check: error: {err}", file=sys.stderr)
        return 2
    if not under_launcher():
        if args.ranks > 1:
            return relaunch(argv, args.ranks)
        single_process_env()

    import deepspeed
    import deepspeed.comm as dist
    from .check import check_gas_invariance, config_dtype, format_results
    deepspeed.init_distributed()
    try:
        results = check_gas_invariance(config, make_model, splits, args.steps, args.pipeline_stages, args.loop)
    except ValueError as err:
        print(f"ds_gas_check: error: {err}", file=sys.stderr)
        return 2
    if dist.get_rank() == 0:
        zero = config.get("zero_optimization", {}).get("stage", 0)
        title = (f"ds_gas_check: deepspeed {deepspeed.__version__}, {dist.get_world_size()} rank(s), {args.config}: "
                 f"ZeRO {zero}, {config_dtype(config)}, optimizer {config['optimizer'].get('type')}, "
                 f"{'pipeline %d stages, ' % args.pipeline_stages if args.pipeline_stages else ''}{args.steps} steps")
        print("\n".join([format_results(results, title)] + [f"note: {n}" for n in notes]), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump([dict(vars(r), name=r.name, passed=r.passed) for r in results], f, indent=1)
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
