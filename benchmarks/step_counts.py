#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What a training step costs the host, counted: fork vs pristine upstream on the same torch.

Time on a shared or a CPU machine is noisy; what the host dispatches is not. Per config, one rank trains an MLP
of 12 Linear + GELU layers (AdamW, clipping 1.0, GAS 8) for one step to warm up, then counts over the next:

- ``aten``: ATen operators dispatched (a TorchDispatchMode: what the host asks of the device);
- ``host_reads``: values read back to the host (``aten._local_scalar_dense``: ``.item()``, ``float(t)``,
  ``bool(t)``), each a device sync on a GPU;
- ``collectives``: calls of deepspeed.comm's collectives.

each per non-boundary micro-step (the median of the step's first GAS-1) and for the boundary micro-step (the
last, with ``engine.step()``'s optimizer step).

    python benchmarks/step_counts.py --pristine-python "$(tools/test-against-upstream --venv 0.19.8)" \\
        --json docs/evidence/performance/step_counts-cpu-torch2.13.0.json
    python benchmarks/step_counts.py --worker --configs z2_bf16 --out counts.json   # one side: this interpreter's

Not a test: ``tests/test_step_counts.py`` pins the fork's counts against the recorded file.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path[:0] = [str(HERE.parent), str(HERE.parents[1] / "tools")]

from step_time import engine_config  # noqa: E402
from toolkit.ports import free_port  # noqa: E402
from toolkit.sides import clean_environ, pristine_python  # noqa: E402

GAS = 8
MICRO = 2
WIDTH = 64
LAYERS = 12
COLLECTIVES = ("all_reduce", "reduce_scatter_fn", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor",
               "allgather_fn", "broadcast", "reduce", "all_to_all_single", "barrier")


def config_matrix():
    """name -> (zero stage, dtype, offload)."""
    configs = {}
    for stage in (0, 1, 2, 3):
        for dtype in ("fp32", "bf16"):
            configs[f"z{stage}_{dtype}"] = (stage, dtype, False)
    configs["z2_offload_fp32"] = (2, "fp32", True)
    return configs


CONFIGS = config_matrix()

# ---------------------------------------------------------------------------------------------- worker


def counting_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counting(TorchDispatchMode):

        def __init__(self):
            super().__init__()
            self.aten = 0
            self.host_reads = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.aten += 1
            if func.overloadpacket.__name__ == "_local_scalar_dense":
                self.host_reads += 1
            return func(*args, **(kwargs or {}))

    return Counting()


def run_config(name, seed_extra_op=False):
    import torch
    import deepspeed
    sys.path.insert(0, str(HERE.parents[1] / "tests"))
    from helpers.collectives import CollectiveCounter
    stage, dtype, offload = CONFIGS[name]
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers)
    engine, *_ = deepspeed.initialize(model=model,
                                      model_parameters=model.parameters(),
                                      config=engine_config(stage, offload, dtype, GAS, MICRO, "AdamW", 1e-3))
    device = engine.device
    low = next(engine.module.parameters()).dtype
    batches = [torch.randn(MICRO, WIDTH, generator=torch.Generator().manual_seed(i)) for i in range(GAS)]

    def micro_step(x):
        loss = engine(x.to(device, low)).float().pow(2).mean()
        if seed_extra_op:  # a control: one more op on every micro-step must be seen
            loss = loss + 0.0
        engine.backward(loss)
        engine.step()

    for x in batches:  # warm-up step: lazy allocations and first-use paths out of the count
        micro_step(x)
    counts = []
    for x in batches:
        mode = counting_mode()
        with CollectiveCounter(COLLECTIVES) as collectives, mode:
            micro_step(x)
        counts.append({"aten": mode.aten, "host_reads": mode.host_reads, "collectives": len(collectives.calls)})
    engine.destroy()
    return {
        "non_boundary": {
            key: statistics.median(c[key] for c in counts[:-1])
            for key in counts[0]
        },
        "boundary": counts[-1],
    }


def worker(args):
    import deepspeed
    import torch
    deepspeed.init_distributed()
    results = {"version": deepspeed.__version__, "torch": torch.__version__, "configs": {}}
    # In name order, each control right after its config: counts depend on what ran before in the process (a
    # ZeRO-2 engine built after a ZeRO-3 one dispatches fewer ops per micro-step), so every run keeps one order.
    runs = []
    for name in sorted(args.configs):
        runs.append((name, name, False))
        if name in args.seed_extra_op:
            runs.append((f"{name}+extra_op", name, True))
    for key, name, seeded in runs:
        try:
            results["configs"][key] = run_config(name, seed_extra_op=seeded)
        except Exception as err:  # a config one side cannot run is reported, not fatal to the others
            results["configs"][key] = {"error": f"{type(err).__name__}: {err}"}
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


# ---------------------------------------------------------------------------------------------- parent


def count(python, configs, out, extensions_dir, seed_extra_op=(), timeout=1800):
    """One side's counts: ``python`` runs the worker on one rank, in a process of its own."""
    env = clean_environ(RANK="0",
                        LOCAL_RANK="0",
                        WORLD_SIZE="1",
                        MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(free_port()),
                        TORCH_EXTENSIONS_DIR=str(extensions_dir),
                        OMP_NUM_THREADS="1")
    cmd = [python, str(HERE), "--worker", "--out", str(out), "--configs", *configs]
    if seed_extra_op:
        cmd += ["--seed-extra-op", *seed_extra_op]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0 or not Path(out).exists():
        raise RuntimeError(f"{python} step_counts worker failed (exit {proc.returncode}): {proc.stderr[-3000:]}")
    return json.loads(Path(out).read_text())


def markdown(sides):
    fork, pristine = sides["fork"], sides["pristine"]
    lines = [
        f"fork {fork['version']} vs pristine {pristine['version']}, torch {fork['torch']}, 1 rank, MLP of {LAYERS} "
        f"Linear+GELU ({WIDTH} wide), AdamW, clipping 1.0, GAS {GAS}", "",
        "| config | ATen ops, non-boundary micro-step: fork / pristine | boundary: fork / pristine | host reads "
        "per boundary: fork / pristine | collectives per boundary: fork / pristine |", "|---|---:|---:|---:|---:|"
    ]
    for name, ours in fork["configs"].items():
        theirs = pristine["configs"].get(name, {})
        if "error" in ours or "error" in theirs:
            lines.append(f"| {name} | {ours.get('error', '')} {theirs.get('error', '')} | | | |")
            continue
        cell = lambda part, key: f"{ours[part][key]:g} / {theirs[part][key]:g}"  # noqa: E731
        lines.append(f"| {name} | {cell('non_boundary', 'aten')} | {cell('boundary', 'aten')} | "
                     f"{cell('boundary', 'host_reads')} | {cell('boundary', 'collectives')} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help="count with this interpreter's deepspeed")
    parser.add_argument("--out", help="the worker's results file")
    parser.add_argument("--seed-extra-op",
                        nargs="*",
                        default=[],
                        choices=sorted(CONFIGS),
                        metavar="CONFIG",
                        help="a control: these configs again, as CONFIG+extra_op, with one more op per micro-step")
    parser.add_argument("--configs", nargs="+", default=sorted(CONFIGS), choices=sorted(CONFIGS))
    parser.add_argument("--fork-python", default=sys.executable)
    parser.add_argument("--pristine-python",
                        help="default: the venv of tools/test-against-upstream on the fork's torch and Python")
    parser.add_argument("--extensions-dir", default="build/bench-extensions", help="one subdirectory per side")
    parser.add_argument("--json", help="also write both sides' counts here")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    sides = {"fork": args.fork_python, "pristine": pristine_python(args.pristine_python, args.fork_python)}
    with tempfile.TemporaryDirectory() as tmp:
        counted = {
            side: count(python, args.configs,
                        Path(tmp) / f"{side}.json",
                        Path(args.extensions_dir).resolve() / side)
            for side, python in sides.items()
        }
    print(markdown(counted))
    if args.json:
        Path(args.json).write_text(json.dumps(counted, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
