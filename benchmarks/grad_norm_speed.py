#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Time of one global grad norm over gradient sets shaped like GPT-2 125M and 350M, fp32 and bf16.

Side by side in one run: the installed deepspeed (this fork: the fused_norm op) and, with
``--upstream-python``, pristine upstream run by that interpreter on the same shapes. Columns:

- fused op: ``deepspeed.ops.fused_norm.sum_of_squares`` (the fork);
- ds utils: ``deepspeed.runtime.utils.get_global_norm_of_tensors`` (BF16_Optimizer's norm; the
  fork routes it through the op, upstream takes an fp32 copy and a norm per tensor);
- ZeRO-1/2 loop: upstream's stage_1_and_2 method, ``vector_norm(g.to(get_norm_dtype()))`` per
  tensor (fp64 copies), stacked and summed;
- torch foreach: ``torch._foreach_norm(dtype=fp32)``, the fastest torch option (and an inaccurate
  one: see its error column);
- copy: ``dst.copy_(src)`` of a buffer as large as the set, the machine's own memory limit.

GB/s counts the bytes of the gradient set read once. Ratios are vs torch foreach and vs upstream's
ZeRO-1/2 loop. Targets: CPU >= 1.0x the best torch option; CUDA >= 90% of the copy bandwidth.

    python benchmarks/grad_norm_speed.py --upstream-python build/upstream-venv-0.19.8/bin/python
"""

import argparse
import json
import subprocess
import time

import torch

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


def best_time(fn, device, repeat):
    fn()
    sync(device)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return min(times)


def methods():
    """name -> fn(tensors) returning the squared norm as a python float, for what is installed."""
    found = {}
    try:
        from deepspeed.ops.fused_norm import sum_of_squares
        found["fused op"] = lambda ts: sum_of_squares(ts, implementation="op").total
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


def measure(device, repeat):
    import deepspeed
    rows = []
    for model in MODELS:
        for dtype in (torch.float32, torch.bfloat16):
            tensors = make_set(model, dtype, device)
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
            exact = sum(float(t.double().pow(2).sum()) for t in tensors)
            src = torch.empty(nbytes, dtype=torch.uint8, device=device)
            dst = torch.empty_like(src)
            row = {"model": model, "dtype": str(dtype).replace("torch.", ""), "bytes": nbytes}
            row["copy"] = {"seconds": best_time(lambda: dst.copy_(src), device, repeat), "rel_error": 0.0}
            for name, fn in methods().items():
                seconds = best_time(lambda: fn(tensors), device, repeat)
                got = float(fn(tensors))
                row[name] = {"seconds": seconds, "rel_error": abs(got - exact) / exact}
            rows.append(row)
    return {
        "deepspeed": deepspeed.__version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "rows": rows
    }


def table(fork, upstream):
    names = ["fused op", "ds utils", "ZeRO-1/2 loop", "torch foreach"]
    lines = [
        f"fork: deepspeed {fork['deepspeed']}" +
        (f"; upstream: deepspeed {upstream['deepspeed']}" if upstream else "") +
        f"; torch {fork['torch']}, {fork['threads']} threads", "", "| set | dtype | MB | " +
        " | ".join(f"{n} ms (GB/s)"
                   for n in names) + (" | upstream ds utils ms | upstream ZeRO-1/2 loop ms" if upstream else "") +
        " | copy GB/s | fused vs foreach | fused vs upstream ZeRO-1/2 | fused err | foreach err |",
        "|---" * (8 + len(names) + (2 if upstream else 0)) + "|"
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
        lines.append(
            f"| {row['model']} | {row['dtype']} | {row['bytes'] / 1e6:.0f} | " + " | ".join(cells) +
            f" | {copy_gbs:.1f} | {ratio_foreach} | {ratio_upstream} | "
            f"{fused['rel_error'] if fused else float('nan'):.1e} | {row['torch foreach']['rel_error']:.1e} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--upstream-python", help="interpreter with pristine upstream deepspeed installed")
    parser.add_argument("--json", action="store_true", help="print raw results as JSON (used for --upstream-python)")
    args = parser.parse_args()
    results = measure(args.device, args.repeat)
    if args.json:
        print(json.dumps(results))
        return
    upstream = None
    if args.upstream_python:
        proc = subprocess.run(
            [args.upstream_python, __file__, "--json", "--device", args.device, "--repeat",
             str(args.repeat)],
            capture_output=True,
            text=True,
            check=True)
        upstream = json.loads(proc.stdout.strip().splitlines()[-1])
    print(table(results, upstream))


if __name__ == "__main__":
    main()
