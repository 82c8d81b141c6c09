#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Host time of one fused-norm call, without and with the plan kept across calls (SumOfSquaresPlan).

The sets are a GPT-2 gradient set's tensor list (148 tensors for 125M, 292 for 350M), each in three
forms:

- ``tiny``: one element per tensor, so the call's time is its host overhead (walking the list,
  describing the tensors, building the chunk plan; on CUDA copying it and launching);
- ``moved``: tiny, but two copies alternate, as gradients freed and reallocated every step do: the
  plan's layout stays and only its pointer table changes;
- ``full``: the real sizes (on the CPU the kernel's own time then dominates).

"without plan" is ``sum_of_squares(tensors)`` (the path every step took before the plan), "with
plan" is ``sum_of_squares(tensors, plan=plan)``; both in one run, interleaved (A/B per repeat),
median and spread (min-max) of ``--repeat`` timings of ``--inner`` calls each. On CUDA the
time is the host's (calls return without a sync; one sync after each batch, outside the timing of
"host", inside that of "synced").

    python benchmarks/norm_host_time.py [--device cuda] [--json FILE]
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from grad_norm_speed import MODELS, gpt2_gradient_shapes
from toolkit import tables


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def make_sets(model, dtype, device):
    shapes = gpt2_gradient_shapes(*MODELS[model])
    gen = torch.Generator().manual_seed(0)
    tiny = [torch.randn(1, generator=gen).to(dtype).to(device) for _ in shapes]
    moved = [t.clone() for t in tiny]
    full = [(torch.randn(shape, generator=gen) * 1e-3).to(dtype).to(device) for shape in shapes]
    return {"tiny": (tiny, tiny), "moved": (tiny, moved), "full": (full, full)}


def time_calls(call, sets, inner, device):
    """(host, synced) microseconds per call over ``inner`` calls alternating between ``sets``."""
    sync(device)
    start = time.perf_counter()
    for i in range(inner):
        call(sets[i % 2])
    host = time.perf_counter() - start
    sync(device)
    synced = time.perf_counter() - start
    return host / inner * 1e6, synced / inner * 1e6


def measure(model, dtype, device, repeat, inner, sum_of_squares, SumOfSquaresPlan):
    rows = []
    for form, sets in make_sets(model, dtype, device).items():
        plan = SumOfSquaresPlan()
        variants = {
            "without plan": lambda s: sum_of_squares(s, device=device),
            "with plan": lambda s, plan=plan: sum_of_squares(s, device=device, plan=plan),
        }
        calls = inner if form != "full" else max(2, inner // 50 if device == "cpu" else inner)
        for call in variants.values():  # warm-up: the op loaded, the plan built, caches hot
            time_calls(call, sets, 4, device)
        timings = {name: [] for name in variants}
        for _ in range(repeat):
            for name, call in variants.items():
                timings[name].append(time_calls(call, sets, calls, device))
        for name, values in timings.items():
            host = sorted(v[0] for v in values)
            synced = sorted(v[1] for v in values)
            rows.append({
                "model": model,
                "dtype": str(dtype).replace("torch.", ""),
                "form": form,
                "variant": name,
                "tensors": len(sets[0]),
                "host_us": statistics.median(host),
                "host_spread_us": [host[0], host[-1]],
                "synced_us": statistics.median(synced),
            })
        rows[-1]["plan_builds"], rows[-1]["plan_pointer_updates"] = plan.builds, plan.pointer_updates
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", nargs="+", default=["gpt2-125m", "gpt2-350m"], choices=sorted(MODELS))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--inner", type=int, default=500)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path("build/bench-extensions").resolve()))
    from deepspeed.ops.fused_norm import SumOfSquaresPlan, load_op, sum_of_squares
    if load_op() is None:
        sys.exit("the fused_norm op did not load: nothing to measure")
    rows = []
    for model in args.models:
        for dtype in args.dtypes:
            rows += measure(model, getattr(torch, dtype), args.device, args.repeat, args.inner, sum_of_squares,
                            SumOfSquaresPlan)
    print(f"device {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"median (min-max) of {args.repeat}")
    columns = [
        "set", "dtype", "form", "tensors", "without plan, us", "with plan, us", "ratio", "synced without / with, us"
    ]
    print("\n".join(tables.header(columns, right=columns[3:])))
    for before, after in zip(rows[0::2], rows[1::2]):
        spread = lambda r: f"{r['host_us']:.1f} ({r['host_spread_us'][0]:.1f}-{r['host_spread_us'][1]:.1f})"
        print(f"| {before['model']} | {before['dtype']} | {before['form']} | {before['tensors']} | {spread(before)} "
              f"| {spread(after)} | {after['host_us'] / before['host_us']:.2f} "
              f"| {before['synced_us']:.1f} / {after['synced_us']:.1f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
