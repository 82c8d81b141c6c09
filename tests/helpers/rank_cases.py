# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The rank side of ``launch.py``: run named cases one after the other, record each outcome.

A worker script defines cases as functions returning JSON-able values and ends with
``run_cases({"name": fn, ...})``. Every rank writes ``rank<N>.json`` with ``{name: {"ok": True,
"value": ...}}`` or ``{"ok": False, "error": traceback}``, and ``rank<N>.progress`` names the case
it is in, so a hang can be located. Each outcome also holds the case's ``seconds`` (for keeping CI's
launches within its budget).
"""

import argparse
import json
import os
import time
import traceback


def run_cases(cases, argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--results-dir", required=True)
    parser.add_argument("--cases", default="", help="comma-separated subset of case names (default: all)")
    parser.add_argument("--exclude", default="", help="comma-separated case names to leave out")
    args, _ = parser.parse_known_args(argv)
    excluded = [c for c in args.exclude.split(",") if c]
    selected = [c for c in ([c for c in args.cases.split(",") if c] or list(cases)) if c not in excluded]
    unknown = [c for c in selected + excluded if c not in cases]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; known: {sorted(cases)}")

    import deepspeed
    import deepspeed.comm as dist
    deepspeed.init_distributed()
    rank = dist.get_rank()
    results = {}
    progress = os.path.join(args.results_dir, f"rank{rank}.progress")
    for name in selected:
        with open(progress, "w") as f:
            f.write(f"in case '{name}'")
        started = time.perf_counter()
        try:
            results[name] = {"ok": True, "value": cases[name]()}
        except Exception:
            results[name] = {"ok": False, "error": traceback.format_exc()}
        dist.barrier()
        results[name]["seconds"] = round(time.perf_counter() - started, 2)
    with open(progress, "w") as f:
        f.write("finished")
    with open(os.path.join(args.results_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


def force_fp16_on_cpu():
    """The CPU accelerator refuses fp16; the engine's fp16 paths are device-independent, so allow it here."""
    from deepspeed.accelerator import get_accelerator
    get_accelerator().is_fp16_supported = lambda: True
