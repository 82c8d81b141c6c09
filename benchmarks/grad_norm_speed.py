#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Time of one global grad norm over gradient sets shaped like GPT-2 125M and 350M, fp32 and bf16.

Side by side in one run: the installed deepspeed (this fork: the fused_norm op) and, with
``--pristine-python``, pristine upstream run by that interpreter on the same shapes. Columns:

- fused op: ``deepspeed.ops.fused_norm.sum_of_squares`` (the fork), with a SumOfSquaresPlan kept
  across calls as the engine keeps it (``benchmarks/norm_host_time.py`` times the call with and
  without one);
- ds utils: ``deepspeed.runtime.utils.get_global_norm_of_tensors`` (BF16_Optimizer's norm; the
  fork routes it through the op, upstream takes an fp32 copy and a norm per tensor);
- ZeRO-1/2 loop: upstream's stage_1_and_2 method, ``vector_norm(g.to(get_norm_dtype()))`` per
  tensor (fp64 copies), stacked and summed;
- torch foreach: ``torch._foreach_norm(dtype=fp32)``, the fastest torch option (and an inaccurate
  one: see its error column);
- copy: ``dst.copy_(src)`` of a buffer as large as the set, the machine's own memory limit (its
  GB/s counts bytes read and written);
- flat norm: ``vector_norm`` of one contiguous tensor as large as the set (the best case of a
  read-only reduction: no tensor list to walk).

GB/s counts the bytes of the gradient set read once. Ratios are vs torch foreach and vs upstream's
ZeRO-1/2 loop. Targets: CPU >= 1.0x the best torch option; CUDA >= 90% of the copy bandwidth. On
CUDA each timing is the mean of ``--inner`` back-to-back calls (one sync at the end), the best of
``--repeat``: a step calls the norm once, asynchronously, so a per-call sync would time the host.
"fused GPU-busy" is the device time of one call (its kernels and the copy of its plan, from the
profiler): the op's cost to the GPU, without the host's launch overhead, which bounds small sets.

    python benchmarks/grad_norm_speed.py --pristine-python "$(tools/test-against-upstream --venv 0.19.8)"
"""

import argparse
import json
import subprocess
import time

import torch

from toolkit import options, tables

MODELS = {"gpt2-125m": (768, 12), "gpt2-350m": (1024, 24)}  # hidden, layers (vocab 50257, context 1024)


def gpt2_gradient_shapes(hidden, layers, vocab=50257, context=1024):
    shapes = [(vocab, hidden), (context, hidden)]
    for _ in range(layers):
        shapes += [(hidden, ), (hidden, ), (hidden, 3 * hidden), (3 * hidden, ), (hidden, hidden), (hidden, ),
                   (hidden, ), (hidden, ), (hidden, 4 * hidden), (4 * hidden, ), (4 * hidden, hidden), (hidden, )]
    return shapes + [(hidden, ), (hidden, )]


def make_set(model, dtype, device):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(shape, generator=gen) * 1e-3).to(dtype).to(device)
            for shape in gpt2_gradient_shapes(*MODELS[model])]


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def best_time(fn, device, repeat, inner):
    fn()
    sync(device)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        sync(device)
        times.append((time.perf_counter() - start) / inner)
    return min(times)


def methods():
    """name -> fn(tensors) returning the squared norm as a python float, for what is installed."""
    found = {}
    try:
        from deepspeed.ops.fused_norm import SumOfSquaresPlan, sum_of_squares
        plan = SumOfSquaresPlan()  # kept across calls, as a training step keeps it
        found["fused op"] = lambda ts: sum_of_squares(ts, implementation="op", plan=plan).total
    except ImportError:
        pass
    from deepspeed.runtime.utils import get_global_norm_of_tensors
    found["ds utils"] = lambda ts: get_global_norm_of_tensors(ts).double()**2
    from deepspeed.runtime.zero.utils import get_norm_dtype
    found["ZeRO-1/2 loop"] = lambda ts: torch.stack([torch.linalg.vector_norm(g.to(get_norm_dtype()))
                                                     for g in ts]).double().pow(2).sum()
    found["torch foreach"] = lambda ts: torch.stack(torch._foreach_norm(ts, 2, dtype=torch.float32)).double().pow(
        2).sum()
    return found


def gpu_busy_time(fn, calls=20):
    """Device time of one call (kernels and copies, from the profiler): what the op costs the GPU, host
    launch overhead aside."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sum(event.device_time_total for event in prof.key_averages()) / calls / 1e6


def copy_time(nbytes, device, repeat, inner):
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return best_time(lambda: dst.copy_(src), device, repeat, inner)


def flat_norm_time(tensors, exact, device, repeat, inner):
    flat = torch.cat([t.flatten() for t in tensors])

    def flat_norm():
        return torch.linalg.vector_norm(flat, dtype=torch.float32)

    got = float(flat_norm().double())**2
    return {"seconds": best_time(flat_norm, device, repeat, inner), "rel_error": abs(got - exact) / exact}


def measure(device, repeat, inner):
    import deepspeed
    rows = []
    for model in MODELS:
        for dtype in (torch.float32, torch.bfloat16):
            tensors = make_set(model, dtype, device)
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
            exact = sum(float(t.double().pow(2).sum()) for t in tensors)
            row = {"model": model, "dtype": str(dtype).replace("torch.", ""), "bytes": nbytes}
            row["copy"] = {"seconds": copy_time(nbytes, device, repeat, inner), "rel_error": 0.0}
            row["flat norm"] = flat_norm_time(tensors, exact, device, repeat, inner)
            for name, fn in methods().items():
                seconds = best_time(lambda: fn(tensors), device, repeat, inner)
                got = float(fn(tensors))
                row[name] = {"seconds": seconds, "rel_error": abs(got - exact) / exact}
                if device == "cuda" and name == "fused op":
                    row[name]["gpu_seconds"] = gpu_busy_time(lambda: fn(tensors))
            rows.append(row)
    return {
        "deepspeed": deepspeed.__version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "rows": rows
    }


def table(fork, upstream):
    names = ["fused op", "ds utils", "ZeRO-1/2 loop", "torch foreach"]
    columns = ["set", "dtype", "MB"] + [f"{n} ms (GB/s)" for n in names]
    columns += ["upstream ds utils ms", "upstream ZeRO-1/2 loop ms"] if upstream else []
    columns += [
        "flat norm GB/s", "copy GB/s", "fused % of copy", "fused GPU-busy GB/s (% of copy)", "fused vs foreach",
        "fused vs upstream ZeRO-1/2", "fused err", "foreach err"
    ]
    lines = [
        f"fork: deepspeed {fork['deepspeed']}" +
        (f"; upstream: deepspeed {upstream['deepspeed']}" if upstream else "") +
        f"; torch {fork['torch']}, {fork['device']}, {fork['threads']} threads", "", *tables.header(columns)
    ]
    for index, row in enumerate(fork["rows"]):
        gb = row["bytes"] / 1e9
        cells = []
        for name in names:
            if name in row:
                cells.append(f"{row[name]['seconds'] * 1e3:.1f} ({gb / row[name]['seconds']:.1f})")
            else:
                cells.append("-")
        up = upstream["rows"][index] if upstream else None
        if up:
            cells += [f"{up['ds utils']['seconds'] * 1e3:.1f}", f"{up['ZeRO-1/2 loop']['seconds'] * 1e3:.1f}"]
        fused = row.get("fused op")
        ratio_foreach = f"{row['torch foreach']['seconds'] / fused['seconds']:.2f}x" if fused else "-"
        baseline = (up or row)["ZeRO-1/2 loop"]["seconds"]
        ratio_upstream = f"{baseline / fused['seconds']:.2f}x" if fused else "-"
        copy_gbs = 2 * gb / row["copy"]["seconds"]
        of_copy = f"{100 * gb / fused['seconds'] / copy_gbs:.0f}%" if fused else "-"
        busy = fused.get("gpu_seconds") if fused else None
        busy_gbs = f"{gb / busy:.1f} ({100 * gb / busy / copy_gbs:.0f}%)" if busy else "-"
        lines.append(
            f"| {row['model']} | {row['dtype']} | {row['bytes'] / 1e6:.0f} | " + " | ".join(cells) +
            f" | {gb / row['flat norm']['seconds']:.1f} | {copy_gbs:.1f} | {of_copy} | {busy_gbs} | {ratio_foreach} | {ratio_upstream} | "
            f"{fused['rel_error'] if fused else float('nan'):.1e} | {row['torch foreach']['rel_error']:.1e} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--inner", type=int, help="calls per timing (default: 20 on cuda, 1 on cpu)")
    options.add_sides(parser, fork=False, pristine_help="interpreter with pristine upstream deepspeed installed")
    parser.add_argument("--json", action="store_true", help="print raw results as JSON (used for --pristine-python)")
    args = parser.parse_args()
    inner = args.inner or (20 if args.device == "cuda" else 1)
    results = measure(args.device, args.repeat, inner)
    if args.json:
        print(json.dumps(results))
        return
    upstream = None
    if args.pristine_python:
        proc = subprocess.run([
            args.pristine_python, __file__, "--json", "--device", args.device, "--repeat",
            str(args.repeat), "--inner",
            str(inner)
        ],
                              capture_output=True,
                              text=True,
                              check=True)
        upstream = json.loads(proc.stdout.strip().splitlines()[-1])
    print(table(results, upstream))


if __name__ == "__main__":
    main()
