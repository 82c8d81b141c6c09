# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The GAS matrix's rows for the parallelisms beyond data parallelism (``tools/gas_matrix.py --parallel``).

ds_gas_check's fp64 reference is one dense model on one process; MoE with experts split across ranks,
Ulysses sequence parallelism and AutoTP need a reference of the unsplit network. Their workers
(tests/workers/moe_norm.py, sp_norm.py, autotp_norm.py, moe_tp_norm.py, moe_pipe_norm.py) build one: each trains one global batch of 8
samples at several per-rank micro-batch x GAS splits and reports, per rank, the global grad norm and
the applied update against fp64 PyTorch over the whole batch. A cell passes when every rank's norm and
update are within the tolerance its test uses (tests/test_moe_norm.py, test_sp_norm.py,
test_autotp_norm.py, test_moe_tp_norm.py, test_moe_pipe_norm.py), and otherwise names what is off.
"""

import re
from pathlib import Path
from toolkit import tables

WORKERS_DIR = Path(__file__).resolve().parent.parent / "tests" / "workers"

# (row prefix, worker, what the rows are): 2 ranks each.
WORKERS = (
    ("moe_ep2", "moe_norm.py", "MoE, 2 experts, expert parallel 2 (each rank holds a different expert)"),
    ("sp2", "sp_norm.py", "Ulysses sequence parallel 2 (each rank holds half of every sequence)"),
    ("autotp2", "autotp_norm.py", "AutoTP tensor parallel 2 (split linears, replicated norms and biases)"),
    ("moe_tp2", "moe_tp_norm.py", "MoE, 2 experts, under tensor parallel 2 (ep2: a different expert on each "
     "tensor-parallel rank; ep1: both everywhere; expert_tp: expert tensor parallelism)"),
    ("moe_pipe2", "moe_pipe_norm.py", "MoE under 2 pipeline stages (an MoE block of 2 experts on each stage)"),
)
# The tests' tolerances: relative norm error and relative update error, by the path's dtype.
NORM_TOLERANCE = {"bf16": 5e-3, "fp16": 2e-3, "fp32": 1e-6}
UPDATE_TOLERANCE = {
    "moe_ep2": {
        "bf16": 6e-2,
        "fp16": 1e-2,
        "fp32": 1e-6
    },
    "sp2": {
        "fp32": 2e-6
    },
    "autotp2": {
        "fp32": 2e-6
    },
    "moe_tp2": {
        "bf16": 6e-2,
        "fp16": 1e-2,
        "fp32": 1e-6
    },
    "moe_pipe2": {
        "bf16": 6e-2,
        "fp16": 1e-2,
        "fp32": 1e-6
    },
}

_CASE = re.compile(r"^(?P<path>.+?)(?:_sp\d+)?_m(?P<micro>\d+)_g(?P<gas>\d+)$")


def dtype_of(path):
    return next((dtype for dtype in ("bf16", "fp16") if dtype in path), "fp32")


def verdict(prefix, path, rank_results):
    """PASS, or FAIL naming the worst update error and norm factor over the ranks (or a missing norm)."""
    dtype = dtype_of(path)
    norm_tolerance, update_tolerance = NORM_TOLERANCE[dtype], UPDATE_TOLERANCE[prefix][dtype]
    update_errors = [r["update_error"] for r in rank_results if r.get("update_error") is not None]
    factors = [r["norm"] / r["reference_norm"] for r in rank_results if r["norm"] is not None]
    problems = []
    worst_update = max(update_errors, default=None)
    if worst_update is not None and not worst_update <= update_tolerance:
        problems.append(f"update error {worst_update:.2g}")
    if len(factors) < len(rank_results):
        problems.append("no norm reported")
    else:
        worst_factor = max(factors, key=lambda factor: abs(factor - 1), default=1.0)
        if not abs(worst_factor - 1) <= norm_tolerance:
            problems.append(f"norm x{worst_factor:.4g}")
    return "FAIL " + ", ".join(problems) if problems else "PASS"


def rows(prefix, ranks):
    """({row name: {split: cell}}, [splits in order]) from a worker's per-rank outcomes."""
    table, splits = {}, []
    for case, outcome in ranks[0].items():
        match = _CASE.match(case)
        if match is None:
            raise ValueError(f"{prefix}: case {case!r} is not <path>_m<micro>_g<gas>")
        split = f"{match['micro']}x{match['gas']}"
        if split not in splits:
            splits.append(split)
        outcomes = [rank[case] for rank in ranks]
        failed = next((o for o in outcomes if not o["ok"]), None)
        if failed is not None:
            cell = "error: " + failed["error"].strip().splitlines()[-1][:80]
        else:
            cell = verdict(prefix, match["path"], [o["value"] for o in outcomes])
        table.setdefault(f"{prefix}_{match['path']}", {})[split] = cell
    return table, splits


def summary(cells, splits):
    """One cell for a row, as the GAS matrix writes it: PASS when every split passes, else each split's."""
    values = [cells.get(split, "-") for split in splits]
    if all(value == "PASS" for value in values):
        return "PASS"
    return f"{values[0]} (every split)" if len(set(values)) == 1 and len(values) > 1 else " / ".join(values)


def markdown(what, table, splits, version):
    """A worker's table: one row per engine path, its splits summarised in one column."""
    rows = [(name, summary(cells, splits)) for name, cells in table.items()]
    return "\n".join(tables.table([f"{what}: per-rank splits {' / '.join(splits)}", version], rows))
