#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Training step time, this fork vs pristine upstream, interleaved in one run.

A step is what a user times: GAS micro-batches of forward and backward through ``engine``, then
``engine.step()``, of a GPT-2-shaped causal transformer (pre-LayerNorm blocks, learned positions,
tied embedding). The parent runs ``--repeat`` rounds; each round launches the worker once with the
fork's ``deepspeed`` launcher and once with pristine's (the order alternates each round: A/B, B/A,
...), every launch running every config. Per config and side, each launch gives the median step
time of ``--steps`` timed steps (after ``--warmup``); the table gives, over the rounds, the median
of those and their spread (min-max), the ratio fork/pristine (median of the per-round ratios, and
their min-max), and the share of the step spent in the norm and the overflow check on each side
(the methods that take them, timed from outside: upstream's per-group norm and separate overflow
check, the fork's single-collective one).

    python benchmarks/step_time.py --pristine-python "$(tools/test-against-upstream --venv 0.19.8)"
    python benchmarks/step_time.py ... --ranks 1 --model gpt2-125m --configs z1_bf16_gas1 ...  # a GPU

Runs on the CPU accelerator (gloo, one thread per rank) or a GPU, whatever the installs detect.
Not a test: figures go to docs/evidence/performance.md.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1] / "tools"))

from toolkit.ports import free_port  # noqa: E402
from toolkit.sides import pristine_python  # noqa: E402

# hidden, layers, heads, vocab, context
MODELS = {
    "gpt2-tiny": (256, 4, 4, 8192, 64),  # 5.3M parameters: what 2 CPU cores train in a benchmark's time
    "gpt2-small": (512, 8, 8, 16384, 256),  # ~34M
    "gpt2-125m": (768, 12, 12, 50257, 1024),
    "gpt2-350m": (1024, 24, 16, 50257, 1024),
}


def config_matrix():
    """name -> (zero stage, offload, dtype, gas)."""
    configs = {}
    for stage in (1, 2, 3):
        for dtype in ("fp32", "bf16"):
            for gas in (1, 8):
                configs[f"z{stage}_{dtype}_gas{gas}"] = (stage, False, dtype, gas)
    for dtype in ("fp32", "bf16"):
        for gas in (1, 8):
            configs[f"z2_offload_{dtype}_gas{gas}"] = (2, True, dtype, gas)
    return configs


CONFIGS = config_matrix()

# Methods that take the grad norm or the overflow check, on either side (upstream's per-group ones
# and the fork's single-collective ones); only those a side has are timed. Nested calls count once.
NORM_METHODS = {
    "deepspeed.runtime.zero.stage_1_and_2:DeepSpeedZeroOptimizer":
    ["scaled_global_norm", "_global_norm_and_overflow", "check_overflow", "has_overflow"],
    "deepspeed.runtime.zero.stage3:DeepSpeedZeroOptimizer_Stage3":
    ["_get_norm_groups", "_global_norm_in_one_collective", "has_overflow", "_overflow_check_and_loss_scale_update"],
    "deepspeed.runtime.bf16_optimizer:BF16_Optimizer": ["get_global_grad_norm", "clip_grad_norm"],
}

# ---------------------------------------------------------------------------------------------- worker


def gpt2_model(hidden, layers, heads, vocab, context):
    import torch

    class Block(torch.nn.Module):

        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(hidden), torch.nn.LayerNorm(hidden)
            self.qkv, self.proj = torch.nn.Linear(hidden, 3 * hidden), torch.nn.Linear(hidden, hidden)
            self.fc, self.out = torch.nn.Linear(hidden, 4 * hidden), torch.nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, hidden))
            return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))

    class GPT2(torch.nn.Module):

        def __init__(self):
            super().__init__()
            self.wte, self.wpe = torch.nn.Embedding(vocab, hidden), torch.nn.Embedding(context, hidden)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))
            self.ln = torch.nn.LayerNorm(hidden)

        def forward(self, tokens):
            x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
            for block in self.blocks:
                x = block(x)
            logits = self.ln(x) @ self.wte.weight.t()
            return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())

    return GPT2()


class NormTimer:
    """Wall time spent inside NORM_METHODS (outermost call only), per step."""

    def __init__(self, sync):
        self.sync, self.depth, self.seconds = sync, 0, 0.0
        self._restore = []

    def __enter__(self):
        import importlib
        for target, names in NORM_METHODS.items():
            module_name, class_name = target.split(":")
            try:
                cls = getattr(importlib.import_module(module_name), class_name)
            except (ImportError, AttributeError):
                continue
            for name in names:
                if name in vars(cls):
                    original = vars(cls)[name]
                    setattr(cls, name, self._timed(original))
                    self._restore.append((cls, name, original))
        return self

    def __exit__(self, *exc):
        for cls, name, original in reversed(self._restore):
            setattr(cls, name, original)

    def _timed(self, original):
        timer = self

        def timed(*args, **kwargs):
            timer.depth += 1
            start = time.perf_counter() if timer.depth == 1 else None
            try:
                return original(*args, **kwargs)
            finally:
                if start is not None:
                    timer.sync()
                    timer.seconds += time.perf_counter() - start
                timer.depth -= 1

        return timed


def engine_config(stage, offload, dtype, gas, micro, optimizer="Adam", lr=1e-4):
    """The benchmarks' engine: ``optimizer`` (torch's, or DeepSpeed's CPU one with offload), clipping 1.0."""
    zero = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    config = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "optimizer": {
            "type": optimizer,
            "params": {
                "lr": lr,
                "torch_adam": not offload
            }
        },
        "gradient_clipping": 1.0,
        "zero_optimization": zero,
        "steps_per_print": 10**9,
    }
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
    return config


def run_config(name, args, sync, device):
    import torch
    import deepspeed
    stage, offload, dtype, gas = CONFIGS[name]
    torch.manual_seed(0)
    model = gpt2_model(*MODELS[args.model])
    engine, *_ = deepspeed.initialize(model=model,
                                      model_parameters=model.parameters(),
                                      config=engine_config(stage, offload, dtype, gas, args.micro_batch))
    vocab, context = MODELS[args.model][3], MODELS[args.model][4]
    gen = torch.Generator().manual_seed(1 + deepspeed.comm.get_rank())
    batches = [torch.randint(0, vocab, (args.micro_batch, context), generator=gen).to(device) for _ in range(gas)]
    times, norm_times = [], []
    with NormTimer(sync) as timer:
        for step in range(args.warmup + args.steps):
            sync()
            timer.seconds = 0.0
            start = time.perf_counter()
            for tokens in batches:
                engine.backward(engine(tokens))
                engine.step()
            sync()
            if step >= args.warmup:
                times.append(time.perf_counter() - start)
                norm_times.append(timer.seconds)
    engine.destroy()
    return {
        "step_s": statistics.median(times),
        "norm_s": statistics.median(norm_times),
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def worker(args):
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    deepspeed.init_distributed()
    accelerator = get_accelerator()
    device = accelerator.current_device_name()
    results = {"version": deepspeed.__version__, "device": accelerator.device_name(), "configs": {}}
    for name in args.configs:
        try:
            results["configs"][name] = run_config(name, args, accelerator.synchronize, device)
        except Exception as err:  # a config one side cannot run is reported, not fatal to the others
            results["configs"][name] = {"error": f"{type(err).__name__}: {err}"}
    if deepspeed.comm.get_rank() == 0:
        Path(args.out).write_text(json.dumps(results, indent=1))


# ---------------------------------------------------------------------------------------------- parent


def launch(python, args, out, extensions_dir):
    launcher = Path(python).with_name("deepspeed")
    if not launcher.exists():
        sys.exit(f"no deepspeed launcher beside {python}")
    cmd = [
        str(launcher), "--num_gpus",
        str(args.ranks), "--no_local_rank", "--master_port",
        str(free_port()),
        str(HERE), "--worker", "--out",
        str(out), "--model", args.model, "--micro-batch",
        str(args.micro_batch), "--steps",
        str(args.steps), "--warmup",
        str(args.warmup), "--configs", *args.configs
    ]
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(extensions_dir))
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    if proc.returncode != 0 or not Path(out).exists():
        sys.exit(f"launch with {python} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return json.loads(Path(out).read_text())


def summarise(rounds):
    """Per config: each side's median step time and spread, the ratio and its spread, the norm share."""
    rows = []
    for name in rounds[0]["fork"]["configs"]:
        per_side = {side: [r[side]["configs"][name] for r in rounds] for side in ("fork", "pristine")}
        errors = {side: v[0]["error"] for side, v in per_side.items() if "error" in v[0]}
        if errors:
            rows.append({"config": name, "errors": errors})
            continue
        row = {"config": name, "parameters": per_side["fork"][0]["parameters"]}
        for side, values in per_side.items():
            steps = [v["step_s"] for v in values]
            row[side] = {
                "step_ms": statistics.median(steps) * 1e3,
                "spread_ms": [min(steps) * 1e3, max(steps) * 1e3],
                "norm_share": statistics.median(v["norm_s"] / v["step_s"] for v in values),
            }
        ratios = [f["step_s"] / p["step_s"] for f, p in zip(per_side["fork"], per_side["pristine"])]
        row["ratio"], row["ratio_spread"] = statistics.median(ratios), [min(ratios), max(ratios)]
        rows.append(row)
    return rows


def markdown(rows, header):
    lines = [
        header, "", "| config | pristine ms (spread) | fork ms (spread) | fork/pristine (spread) | norm share "
        "pristine / fork |", "|---|---:|---:|---:|---:|"
    ]
    for row in rows:
        if "errors" in row:
            lines.append(f"| {row['config']} | {row['errors']} | | | |")
            continue
        cell = lambda s: f"{s['step_ms']:.1f} ({s['spread_ms'][0]:.1f}-{s['spread_ms'][1]:.1f})"
        lines.append(f"| {row['config']} | {cell(row['pristine'])} | {cell(row['fork'])} | {row['ratio']:.3f} "
                     f"({row['ratio_spread'][0]:.3f}-{row['ratio_spread'][1]:.3f}) | "
                     f"{row['pristine']['norm_share']:.1%} / {row['fork']['norm_share']:.1%} |")
    return "\n".join(lines)


def parent(args):
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="ds-step-time-"))
    work.mkdir(parents=True, exist_ok=True)
    sides = {"fork": args.fork_python, "pristine": args.pristine_python}
    rounds = []
    for index in range(args.repeat):
        order = ["fork", "pristine"] if index % 2 == 0 else ["pristine", "fork"]
        results = {}
        for side in order:
            started = time.time()
            results[side] = launch(sides[side], args, work / f"round{index}-{side}.json",
                                   Path(args.extensions_dir) / side)
            print(f"round {index + 1}/{args.repeat}: {side} done in {time.time() - started:.0f} s", file=sys.stderr)
        rounds.append(results)
    rows = summarise(rounds)
    fork, pristine = rounds[0]["fork"], rounds[0]["pristine"]
    header = (f"{args.model}, {args.ranks} rank(s) on {fork['device']}, micro-batch {args.micro_batch}, "
              f"Adam, clipping 1.0; {args.repeat} rounds x {args.steps} steps; fork {fork['version']}, "
              f"pristine {pristine['version']}")
    table = markdown(rows, header)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "rows": rows, "rounds": rounds}, indent=1) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--fork-python", default=sys.executable)
    parser.add_argument("--pristine-python",
                        help="default: the venv of tools/test-against-upstream on the fork's torch and Python")
    parser.add_argument("--model", default="gpt2-tiny", choices=sorted(MODELS))
    parser.add_argument("--configs", nargs="+", default=sorted(CONFIGS), choices=sorted(CONFIGS))
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per launch")
    parser.add_argument("--extensions-dir", default="build/bench-extensions", help="one subdirectory per side")
    parser.add_argument("--work-dir", help="where each launch's JSON goes (default: a temporary directory)")
    parser.add_argument("--json", help="also write the table's rows and every round's results here")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    # Only the parent needs pristine: a worker resolving it would build a venv on every launch.
    args.pristine_python = pristine_python(args.pristine_python, args.fork_python)
    parent(args)


if __name__ == "__main__":
    main()
