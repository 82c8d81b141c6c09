# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""docs/evidence/README.md: one line per report, its summary read from the results file the tool wrote.

    tools/evidence-index            write docs/evidence/README.md
    tools/evidence-index --check    exit 1 when the committed index differs from what the results say

The figures come from the results files only (a summary that a results file does not hold is a page's, and
says so), so the index cannot drift from the runs; tests/test_docs.py runs --check.
"""

import argparse
import json
import sys

import optimizer_table
from toolkit import REPO, tables

EVIDENCE = REPO / "docs" / "evidence"
INDEX = EVIDENCE / "README.md"


def load(relative):
    return json.loads((EVIDENCE / relative).read_text())


def ratio_range(rows):
    low, high = min(rows, key=lambda r: r["ratio"]), max(rows, key=lambda r: r["ratio"])
    return f"{low['ratio']:.3f} ({low['config']}) to {high['ratio']:.3f} ({high['config']})"


def crash_resume():
    trials = load("crash_resume/fork.json")
    in_save = sum(trial["kill"]["where"] == "save" for trial in trials)
    resumed = sum("restart_error" not in trial and trial["resumed_at"] == trial["expected_resume_at"]
                  for trial in trials)
    on_two = [trial["final_error"] for trial in trials if trial["restart_ranks"] == 2 and "final_error" in trial]
    teardown = [trial["teardown_seconds"] for trial in trials]
    return (f"{len(trials)} seeded trials, one of 2 ranks killed ({in_save} inside a save, {len(trials) - in_save} in "
            f"training): {resumed} restarts resumed at the last finished save, those on 2 ranks ending "
            f"{'bit for bit on' if not any(on_two) else 'off'} the uninterrupted run; the other rank ended "
            f"{min(teardown)}-{max(teardown)} s after the kill")


def upstream_full():
    report = load(f"{UPSTREAM_FULL_RECORD}/report.json")
    sides, cats, who = report["sides"], dict(report["categories"]), report["identity"]
    for rerun in UPSTREAM_FULL_RERUNS:
        for test, entry in load(f"{rerun}/report.json")["tests"].items():
            cats[report["tests"][test]["category"]] -= 1
            cats[entry["category"]] += 1
    return (f"{sides['fork']['run']} tests per side, fork {who['fork_version']} vs pristine {who['pristine_version']} "
            f"(torch {who['torch']}): {cats['regression']} regressions, {cats['fixed']} fixed, "
            f"{cats.get('explained', 0)} explained, "
            f"{cats['both pass']} both pass, {cats['both fail']} both fail, {cats['both skip']} both skip")


VALUE_OUTCOMES = {"arrives": "arrive", "mangled": "arrive mangled", "launch failed": "end the launch", "ran": "run"}


def _value_outcomes(results):
    """side -> {outcome: [value names]} of the table of values."""
    values = {}
    for key, outcome in results.items():
        if key.startswith("value/"):
            _, name, side = key.split("/")
            values.setdefault(side, {}).setdefault(outcome, []).append(name)
    return values


def _failure_trials(results):
    trials = {}
    for key, outcome in results.items():
        if key.startswith("failure/"):
            _, case, side = key.split("/")
            trials.setdefault(side, {})[case] = outcome
    fork = list(trials.get("fork", {}).values())
    stopped = [trial["seconds"] for trial in fork if trial["returncode"] not in (None, 0)]
    if not fork or len(stopped) < len(fork):
        return "; a failure trial of the fork did not stop"
    text = (f"; {len(fork)} kinds of failure (a rank before the rendezvous or in training, a node killed or cut off, "
            f"the runner stopped or killed): every process of the job gone {min(stopped)}-{max(stopped)} s after, "
            f"{sum(trial['left'] for trial in fork)} left")
    pristine = list(trials.get("pristine", {}).values())
    if pristine:
        hung = sum(trial["returncode"] is None for trial in pristine)
        leaving = sum(trial["left"] > 0 for trial in pristine)
        text += f" (0.19.8: {hung} of {len(pristine)} not stopped within the bound, {leaving} left processes)"
    return text


def _lost_nodes(results):
    """The lost-node resumes (by hand, by --max_restarts, seeded trials): how many, and the worst final weights."""
    runs = [outcome for key, outcome in results.items() if key.startswith("lost-node")]
    if not runs:
        return ""
    resumed = [run for run in runs if run["left"] == 0 and "final_weights_relative_error" in run]
    worst = max(run["final_weights_relative_error"] for run in resumed)
    return (f"; a node lost in training or in a save, {len(runs)} runs: {len(resumed)} resumed on the survivor from "
            f"the last complete save, final weights within {worst:.1e} of the uninterrupted run")


def multi_node():
    """tests/test_multinode.py's record (DS_GAFIX_MULTINODE_JSON): the demo across nodes, each value's outcome, the
    failure trials."""
    results = load("multi_node/results.json")
    demos = [key for key in results if key.startswith("demo/")]
    agree = sorted(key.split("/", 1)[1] for key in demos if results[key]["agrees"])
    disagree = sorted(key.split("/", 1)[1] for key in demos if not results[key]["agrees"])
    values = _value_outcomes(results)
    sides = "; ".join(f"{'fork' if side == 'fork' else '0.19.8'}: " +
                      ", ".join(f"{len(names)} {VALUE_OUTCOMES[outcome]}"
                                for outcome, names in sorted(values[side].items())) for side in ("fork", "pristine")
                      if side in values)
    counted = sum(map(len, values.get("fork", {}).values()))
    return (f"Nodes through the real runner, pdsh and ssh: the demo agrees with fp64 at {', '.join(agree)}"
            f"{'; disagrees at ' + ', '.join(disagree) if disagree else ''}; {counted} hostile and ordinary values, "
            f"one at a time, {sides}{_failure_trials(results)}{_lost_nodes(results)}")


RESHARD_RECORD = "reshard/results.json"


def reshard():
    """benchmarks/reshard.py's record: the largest model's moves, resharded as it loads against the load on the ranks
    that saved, the universal route and torch.distributed.checkpoint."""
    runs = load(RESHARD_RECORD)
    size = runs[-1]["size"]
    largest = [run for run in runs if run["size"] == size]

    def of(move, way):
        return next(run for run in largest if run["move"] == move and run["way"].startswith(way))

    def left(way):
        return max(run["disk_left"] for run in largest if run["way"].startswith(way)) / 2**30

    moves = [run["move"] for run in largest if run["way"].startswith("DeepSpeed, resharded")]
    return (f"ZeRO-2 at {size}: " + "; ".join(
        f"{move} ranks {of(move, 'DeepSpeed, resharded')['seconds']:.1f} s as it loads (the same ranks "
        f"{of(f'{move[0]} -> {move[0]}', 'DeepSpeed, same')['seconds']:.1f} s, through the universal format "
        f"{of(move, 'DeepSpeed, through')['seconds']:.1f} s, torch.distributed.checkpoint "
        f"{of(move, 'torch.distributed')['seconds']:.1f} s)"
        for move in moves) + f"; left on disk {left('DeepSpeed, resharded'):.2f} GiB, through the universal format "
            f"{left('DeepSpeed, through'):.2f} GiB")


def patch_tests():
    report = load("patch_tests/report.json")
    fork, pristine = report["sides"]["fork"], report["sides"]["pristine"]
    return (f"each patch's own test: fork {fork['passed']} of {fork['run']} passed; pristine {pristine['failed']} "
            f"of {pristine['run']} failed ({report['identity']['fork_version']})")


def version_matrix():
    cells = load("version_matrix/results.json")
    green = [
        key.replace("@", " / Python ") for key, cell in sorted(cells.items())
        if "stage_failed" not in cell and cell["failed"] == 0 and cell.get("patch_tier") == "0 regressions"
    ]
    return (f"{len(green)} of {len(cells)} (torch, Python) cells pass the whole suite with 0 patch-tier "
            f"regressions: torch {', torch '.join(green)}")


def client_tier():

    def counts(report):
        selections = report["selections"].values()
        regressions = sum(len(s["regressions"]) for s in selections)
        fixed = sum(len(s["fixed"]) for s in selections)
        both_pass = sum(s["categories"]["both pass"] for s in selections)
        return f"{regressions} regressions, {fixed} fixed, {both_pass} both pass"

    report, before = load("client_tier/report.json"), load("client_tier/transformers-5.23.0/report.json")
    # The previous pins' run may be of an earlier release: said so, not folded into this one's version.
    older = "" if before["fork_version"] == report["fork_version"] else f" (fork {before['fork_version']})"
    return (f"transformers' and accelerate's DeepSpeed tests, fork {report['fork_version']} vs "
            f"{report['pristine_version']}: on transformers {report['transformers']}, {counts(report)}; "
            f"on {before['transformers']}{older}, {counts(before)}")


def optimizers():
    # The verdicts are tools/optimizer-table's own, from its pass criteria (tools/optimizer_criteria.py).
    sides = load("optimizers/results.json")["sides"]
    fork, pristine = (optimizer_table.tally(sides[side]["cases"]) for side in ("fork", "pristine"))
    return (f"every optimizer x ZeRO stage (+ offload), 3 clipped steps against fp64: fork {fork[0]} pass, "
            f"{fork[1]} fail; pristine {pristine[0]} pass, {pristine[1]} fail; {fork[2]} GPU-only cases not run")


# The dated records the index reads: each page beside the results file of the same stem.
GPU_RECORD = "gpu_check/2026-11-27"
# The newest complete run of upstream's full tier.
UPSTREAM_FULL_RECORD = "upstream_suite/full"
# Its files run again on both sides on one machine, whose verdicts replace the record's (where the record's two
# sides ran on machines that differ in what matters to those files, such as a system library on one only).
UPSTREAM_FULL_RERUNS = ()
CUDA_BUILD_RECORD = "cuda_build/2026-11-25"


def gpu_check():
    record = load(f"{GPU_RECORD}.json")
    checks = record["checks"]
    passed = [c["name"] for c in checks if c["result"] == "PASS"]
    failed = [c["name"] for c in checks if c["result"] != "PASS"]
    not_run = [c["name"] for c in record.get("not_run", [])]
    return (f"{len(passed)} of {len(checks)} checks pass on {record['environment']['device']}" +
            (f" (open: {', '.join(failed)})" if failed else "") +
            (f"; not run: {', '.join(not_run)}" if not_run else ""))


def cuda_build():
    rows = load(f"{CUDA_BUILD_RECORD}.json")["rows"]
    built = [r for r in rows if r["built"]]
    same = all(r.get("cpu_path_equal") for r in built)
    return (f"fused_norm built without a GPU for torch {', '.join(r['torch'] for r in built)} "
            f"({', '.join(sorted({g for r in built for g in r['gencode']}))}); CPU kernel "
            f"{'bit for bit' if same else 'NOT bit for bit'} the CPU-only build's; not built: "
            f"{', '.join(r['torch'] for r in rows if not r['built']) or 'none'}")


def step_time():
    # The offload rows were measured again after patch Take-the-ZeRO-1-2-global-grad-norm-in-one-fused-op-a's change
    # (docs/evidence/performance.md): theirs replace.
    rows = {r["config"]: r for r in load("performance/step_time-cpu-2026-11-23.json")["rows"]}
    rows.update({r["config"]: r for r in load("performance/step_time-cpu-offload-2026-11-23.json")["rows"]})
    cpu = list(rows.values())
    gpt2 = load("performance/step_time-h100-gpt2-125m-bf16-5rounds-2026-11-26.json")["rows"]
    llama = load("performance/step_time-h100-llama-1b-bf16-5rounds-2026-11-26.json")["rows"]
    return (f"fork/pristine step time: 2 CPU ranks {ratio_range(cpu)} over {len(cpu)} configs; one H100, 5 rounds, "
            f"bf16 ZeRO-2/3 at GAS 1 and 8: GPT-2 125M {ratio_range(gpt2)}, Llama 1B {ratio_range(llama)}")


def gas_check_memory(name="gas_check/memory-cpu-2026-11-25.jsonl"):
    rows = [json.loads(line) for line in (EVIDENCE / name).read_text().splitlines() if line.strip()]
    checked = [r for r in rows if r["mode"] == "no-reference" and r["exit"] == 0]
    largest = max(checked, key=lambda r: r["parameters"])
    training = next(r for r in rows if r["mode"] == "training" and r["size"] == largest["size"]
                    and r["dtype"] == largest["dtype"] and r["offload"] == largest["offload"])
    caught = [r for r in rows if r["mode"] == "control" and r["exit"] == 1]
    return (f"largest model checked: {largest['parameters'] / 1e6:.0f}M parameters, ZeRO-{largest['zero']} "
            f"{largest['dtype']}{' + offload' if largest['offload'] else ''}, "
            f"{max(largest['rank_peaks_gib'])} GiB per rank beside training's {max(training['rank_peaks_gib'])}; "
            f"a dropped micro-batch caught in {len(caught)} of {len([r for r in rows if r['mode'] == 'control'])} "
            "controls")


def sequence_parallel():
    results = load("sequence_parallel/results.json")

    def right(case):  # tests/test_sp_norm.py's tolerances
        norm = case["norm"]
        return (norm is not None and abs(norm / case["reference_norm"] - 1) <= 1e-6 and case["update_error"] <= 2e-6)

    def right_through_accelerate(case):  # tests/test_accelerate_alst.py's tolerances: bf16 judged by its norm
        norm_error = abs(case["norm"] / case["reference_norm"] - 1)
        if case["dtype"] == "torch.bfloat16":
            return norm_error <= 1e-2
        return norm_error <= 1e-6 and case["update_error"] <= 1e-5

    parts = []
    for side, by_ranks in results["sides"].items():
        cases = [case for of_ranks in by_ranks.values() for case in of_ranks.values()]
        parts.append(f"{side}: norm and update within fp32 of fp64 in {sum(map(right, cases))} of {len(cases)} cases")
    accelerate = load("sequence_parallel/accelerate.json")["sides"]
    through = ", ".join(f"{side} {sum(map(right_through_accelerate, cases.values()))} of {len(cases)}"
                        for side, cases in accelerate.items())
    return ("; ".join(parts) + " (Ulysses SP 2 at DP 1 and 2, ZeRO 0-3, a share or ALST's gathered loss); "
            f"accelerate's ALST recipe at ZeRO 2/3: {through}")


# (page, what it holds, the command behind it, summary: a function of the results, or the page's own words)
REPORTS = [
    ("upstream_suite.md", "Upstream's own test suite, fork vs pristine", "tools/run-upstream-suite --tier full",
     upstream_full),
    ("patch_tests.md", "Each patch's upstream-style test", "tools/run-upstream-suite --tier patch-tests", patch_tests),
    ("version_matrix.md", "The test suite per torch and Python", "tools/version-matrix", version_matrix),
    ("client_tier.md", "Our clients' own DeepSpeed tests", "tools/client-tier", client_tier),
    ("optimizers/report.md", "Optimizers against torch", "tools/optimizer-table", optimizers),
    (f"{GPU_RECORD}.md", "GPU checks", "tools/gpu-check", gpu_check),
    ("cuda_build.md", "The CUDA build without a GPU", "tools/cuda-build-tier", cuda_build),
    ("performance.md", "Step time, fork vs pristine", "python benchmarks/step_time.py", step_time),
    ("gas_check.md#memory", "ds_gas_check on large models", "python benchmarks/gas_check_memory.py", gas_check_memory),
    ("sequence_parallel.md", "Sequence parallelism against fp64, both loss recipes",
     "python -m pytest tests/test_sp_norm.py", sequence_parallel),
    ("grad_norm.md", "The grad norm: speed, collectives, MoE / TP / SP / AutoEP against fp64",
     "python benchmarks/grad_norm_speed.py; tools/norm_error_table.py",
     "page: the fork's norm within fp32 rounding of fp64 on every path, in 1 collective; 0.19.8's off by up to "
     "23% (fp16 MoE), missing, or hanging on the paths each table names"),
    ("gas_matrix.md", "GAS invariance of every engine path, fork and pristine releases", "tools/gas_matrix.py",
     "page: the fork passes every case; 0.19.8 fails fp16 without ZeRO, clipped fp32 pipelines and fp16 "
     "loss-scale growth"),
    ("per_item_loss.md", "Per-item losses against the fp64 item mean", "python -m pytest tests/test_per_item_loss.py",
     "page: per_item within 1.3e-6 (fp32) of the global item mean at every split, mean mode 5.5% to 26% off"),
    ("hf_trainer.md", "Hugging Face Trainer versions", "tools/hf_matrix.py",
     "page: transformers 5.24.0 and 5.23.0 with accelerate 1.15.0 right on every case, fork and 0.19.8 alike"),
    ("crash_resume.md", "A rank killed in training or in a save",
     "python -m pytest tests/test_crash_resume.py --run-slow", crash_resume),
    ("resume.md", "Resuming on another number of ranks", "python -m pytest tests/test_resume_world_size.py --run-slow",
     "page: with checkpoint.reshard_on_load the resumed run continues the writer's (2 -> 1, 1 -> 2, 2 -> 4, 4 -> 2 "
     "ranks, ZeRO 1-3, Muon included; the HF Trainer and accelerate's load_state 2 -> 1; ds_gas_check --restart "
     "against fp64); 0.19.8 refuses every move"),
    ("reshard.md", "What a resume on another number of ranks costs", "python benchmarks/reshard.py", reshard),
    ("multi_node.md", "The launcher across nodes", "python -m pytest tests/test_multinode.py --run-slow", multi_node),
    ("safe_checkpoints.md", "Safe checkpoint loading: every loader, fork vs 0.19.8",
     "python -m pytest tests/test_safe_checkpoints.py --run-slow",
     "page: a payload in one file refused at every loader (load_checkpoint at ZeRO 2/3 and the pipeline, "
     "reshard_on_load, universal, zero_to_fp32, ds_to_universal), 0.19.8 ran it at each; a flipped byte or a file "
     "cut short named at each, on every rank, where 0.19.8 loaded it; every file of 11 configurations, and of "
     "gafix.1-5's checkpoints, loads deep-equal to an unchecked load; the check costs 10 ms or less per tag, "
     "verifying no measurable load time"),
]


def render():
    lines = [
        "# Evidence", "", "Generated by `tools/evidence-index` from the results files in this directory: do not edit.",
        "Each line is a report, what it measured, and the command that reproduces it; \"page:\" marks a summary",
        "taken from the report's own text, where no results file holds the figures.", "",
        *tables.header(["report", "summary", "command"])
    ]
    for page, title, command, summary in REPORTS:
        text = summary() if callable(summary) else summary
        lines.append(f"| [{title}]({page}) | {text} | `{command}` |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed index instead of writing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not INDEX.exists() or INDEX.read_text() != text:
            print(f"{INDEX.relative_to(REPO)} is out of date: run tools/evidence-index", file=sys.stderr)
            return 1
        return 0
    INDEX.write_text(text)
    print(f"wrote {INDEX.relative_to(REPO)}")
    return 0
