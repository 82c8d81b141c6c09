#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What a training step costs the host, counted: fork vs pristine upstream on the same torch.

Time on a shared or a CPU machine is noisy; what the host dispatches is not. Per config, one rank trains an MLP
of 12 Linear + GELU layers (``moe_`` configs: the middle Linear a MoE layer of 2 experts; ``pipe_``: the layers as
a one-stage pipeline; AdamW, clipping 1.0, GAS 8) for one step to warm up, then counts over the next:

- ``aten``: ATen operators dispatched (a TorchDispatchMode: what the host asks of the device);
- ``host_reads``: values read back to the host (``aten._local_scalar_dense``: ``.item()``, ``float(t)``,
  ``bool(t)``), each a device sync on a GPU;
- ``collectives``: calls of deepspeed.comm's collectives;
- ``hooks``: backward-hook calls, deepspeed's Python functions the autograd engine called (gradient hooks,
  autograd functions' backward);
- ``python_calls``: all calls of deepspeed's Python functions (in a step of their own, apart from the above).

each per non-boundary micro-step (the median of the step's first GAS-1) and for the boundary micro-step (the
last, with ``engine.step()``'s optimizer step). On a CUDA device, one more step under the profiler adds ``device``:
kernel launches and device-side time per micro-step (benchmarks/device_profile.py).

    python benchmarks/step_counts.py --pristine-python "$(tools/test-against-upstream --venv 0.19.8)" \\
        --json docs/evidence/performance/step_counts-cpu-torch2.13.0.json
    python benchmarks/step_counts.py --worker --configs z2_bf16 --out counts.json   # one side: this interpreter's

fp16 configs let the CPU accelerator take fp16 while they run (the engine's fp16 paths do not depend on the
device). A pipeline engine runs a step's micro-batches inside ``train_batch``: its step is counted whole, as its
boundary, with no non-boundary count.
Not a test: ``tests/test_step_counts.py`` pins the fork's counts against the recorded file.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()

from device_profile import per_micro_step, summary
from step_time import engine_config
from toolkit import options, tables
from toolkit.ports import free_port
from toolkit.sides import clean_environ, pristine_python

GAS = 8
MICRO = 2
WIDTH = 64
LAYERS = 12
COLLECTIVES = ("all_reduce", "reduce_scatter_fn", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor",
               "allgather_fn", "broadcast", "reduce", "all_to_all_single", "barrier")


def config_matrix():
    """name -> (zero stage, dtype, offload, model: "mlp", "moe" or "pipe")."""
    configs = {}
    for stage in (0, 1, 2, 3):
        for dtype in ("fp32", "bf16"):
            configs[f"z{stage}_{dtype}"] = (stage, dtype, False, "mlp")
    configs["z2_offload_fp32"] = (2, "fp32", True, "mlp")
    for stage in (0, 2):  # the fp16 optimizers: FP16_Optimizer (no ZeRO) and ZeRO's loss scaling
        configs[f"z{stage}_fp16"] = (stage, "fp16", False, "mlp")
    for stage in (1, 2):  # ZeRO-3 builds no MoE engine in 0.19.8
        configs[f"moe_z{stage}_bf16"] = (stage, "bf16", False, "moe")
    configs["pipe_z1_bf16"] = (1, "bf16", False, "pipe")  # one stage: the pipeline engine's schedule on one rank
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


class PythonCalls:
    """Calls of deepspeed's Python functions: all of them (``python_calls``) and those the autograd engine made
    (``hooks``: backward hooks and autograd functions' backward, whose caller is torch.autograd's engine call or
    no Python frame at all). Counted on this thread: on a CUDA device backward hooks run on the autograd
    engine's own threads, so ``hooks`` is read on the CPU accelerator."""

    def __init__(self):
        import deepspeed
        import torch.autograd
        self.ours, self.autograd = Path(deepspeed.__file__).parent, Path(torch.autograd.__file__).parent
        self.ours, self.autograd = str(self.ours) + os.sep, str(self.autograd / "graph.py")
        self.python_calls = self.hooks = 0

    def __enter__(self):
        self._before = sys.getprofile()
        sys.setprofile(self._count)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self._before)

    def _count(self, frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(self.ours):
            self.python_calls += 1
            caller = frame.f_back
            if caller is None or caller.f_code.co_filename == self.autograd:
                self.hooks += 1


def build_layers(model):
    """The counted layers: 12 Linear + GELU; with "moe", the middle Linear is a MoE layer of 2 experts."""
    import torch

    class MoELayer(torch.nn.Module):

        def __init__(self):
            super().__init__()
            from deepspeed.moe.layer import MoE
            self.moe = MoE(hidden_size=WIDTH,
                           expert=torch.nn.Linear(WIDTH, WIDTH),
                           num_experts=2,
                           k=1,
                           ep_size=1,
                           capacity_factor=2.0,
                           min_capacity=1)  # a micro-batch of MICRO tokens, none dropped

        def forward(self, x):
            return self.moe(x)[0]

    layers = []
    for index in range(LAYERS):
        middle = model == "moe" and index == LAYERS // 2
        layers += [MoELayer() if middle else torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()]
    return layers


def loss_of(output, label=None):
    return output.float().pow(2).mean()


class Engine:
    """One config's engine and a micro-step of it (a pipeline: a whole step, its micro-steps run inside)."""

    def __init__(self, name, seed_extra_op):
        import torch
        import deepspeed
        stage, dtype, offload, model = CONFIGS[name]
        torch.manual_seed(0)
        layers = build_layers(model)
        if model == "pipe":
            from deepspeed.pipe import PipelineModule
            module = PipelineModule(layers=layers, num_stages=1, loss_fn=loss_of)
        else:
            module = torch.nn.Sequential(*layers)
        parameters = module.parameters()
        if model == "moe":  # expert parameters in groups of their own, as DeepSpeed's MoE asks of its users
            from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
            parameters = split_params_into_different_moe_groups_for_optimizer({
                "params": list(parameters),
                "name": "dense"
            })
        self.engine, *_ = deepspeed.initialize(model=module,
                                               model_parameters=parameters,
                                               config=engine_config(stage, offload, dtype, GAS, MICRO, "AdamW", 1e-3))
        self.pipeline, self.seed_extra_op = model == "pipe", seed_extra_op
        low = next(self.engine.module.parameters()).dtype
        self.batches = [
            torch.randn(MICRO, WIDTH, generator=torch.Generator().manual_seed(i)).to(self.engine.device, low)
            for i in range(GAS)
        ]

    def micro_steps(self):
        """Callables, one per counted unit: GAS micro-steps, or one step of a pipeline."""
        if self.pipeline:
            return [lambda: self.engine.train_batch(data_iter=iter([(x, x) for x in self.batches]))]
        return [lambda x=x: self.micro_step(x) for x in self.batches]

    def micro_step(self, x):
        loss = loss_of(self.engine(x))
        if self.seed_extra_op:  # a control: one more op on every micro-step must be seen
            loss = loss + 0.0
        self.engine.backward(loss)
        self.engine.step()


def run_config(name, seed_extra_op=False):
    from deepspeed.accelerator import get_accelerator
    from toolkit.collectives import CollectiveCounter
    accelerator = get_accelerator()
    fp16_supported = accelerator.is_fp16_supported
    if CONFIGS[name][1] == "fp16":  # the engine's fp16 paths are device-independent; the CPU one reports none
        accelerator.is_fp16_supported = lambda: True
    try:
        run = Engine(name, seed_extra_op)
        for micro_step in run.micro_steps():  # warm-up step: lazy allocations and first-use paths out of the count
            micro_step()
        counts = []
        for micro_step in run.micro_steps():
            mode = counting_mode()
            with CollectiveCounter(COLLECTIVES) as collectives, mode:
                micro_step()
            counts.append({"aten": mode.aten, "host_reads": mode.host_reads, "collectives": len(collectives.calls)})
        for count, micro_step in zip(counts, run.micro_steps()):  # one more step, apart: the dispatch mode's own
            with PythonCalls() as calls:  # Python calls stay out
                micro_step()
            count.update(hooks=calls.hooks, python_calls=calls.python_calls)
        # On a CUDA device, one more step under the profiler: what the device was asked to do and how long it took.
        profile = summary(per_micro_step(run.micro_steps(), accelerator.synchronize))
        run.engine.destroy()
    finally:
        accelerator.is_fp16_supported = fp16_supported
    # A pipeline's step is counted whole (as its boundary): no micro-step of it runs apart.
    return {**summary(counts), **({"device": profile} if profile else {})}


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


COUNT_COLUMNS = [
    "config", "ATen ops, non-boundary micro-step", "boundary", "host reads, non-boundary", "boundary",
    "collectives, non-boundary", "boundary", "backward-hook calls, non-boundary", "boundary",
    "deepspeed Python calls, non-boundary", "boundary"
]


def markdown(sides):
    fork, pristine = sides["fork"], sides["pristine"]
    lines = [
        f"fork {fork['version']} vs pristine {pristine['version']}, torch {fork['torch']}, 1 rank, MLP of {LAYERS} "
        f"Linear+GELU ({WIDTH} wide; moe_: the middle Linear a MoE layer of 2 experts), AdamW, clipping 1.0, "
        f"GAS {GAS}; each cell fork / pristine", "", *tables.header(COUNT_COLUMNS, right=COUNT_COLUMNS[1:])
    ]
    for name, ours in fork["configs"].items():
        theirs = pristine["configs"].get(name, {})
        if "error" in ours or "error" in theirs:
            lines.append(f"| {name} | {ours.get('error', '')} {theirs.get('error', '')} |" + " |" * 9)
            continue
        cell = lambda part, key: "-" if ours[
            part] is None else f"{ours[part][key]:g} / {theirs[part][key]:g}"  # noqa: E731
        lines.append(f"| {name} | " + " | ".join(
            cell(part, key) for key in ("aten", "host_reads", "collectives", "hooks", "python_calls")
            for part in ("non_boundary", "boundary")) + " |")
    profiled = [name for name, ours in fork["configs"].items() if "device" in ours]
    if profiled:
        lines += [
            "", "On the device, from the profiler (one step): kernel launches and device-side ms per micro-step", "",
            *tables.header(
                [
                    "config", "launches, non-boundary: fork / pristine", "boundary", "device ms, non-boundary",
                    "boundary"
                ],
                right={"launches, non-boundary: fork / pristine", "boundary", "device ms, non-boundary", "boundary"})
        ]
        for name in profiled:
            ours, theirs = fork["configs"][name]["device"], pristine["configs"].get(name, {}).get("device")
            if not theirs:
                continue
            cell = lambda part, key, form: (
                "-" if ours[part] is None else  # noqa: E731
                f"{ours[part][key]:{form}} / {theirs[part][key]:{form}}")
            lines.append(f"| {name} | {cell('non_boundary', 'launches', 'g')} | {cell('boundary', 'launches', 'g')} | "
                         f"{cell('non_boundary', 'device_ms', '.3f')} | {cell('boundary', 'device_ms', '.3f')} |")
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
    options.add_sides(parser)
    options.add_extensions_dir(parser, default="build/bench-extensions", per_side=True)
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
