# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Every GPU check and benchmark of deepspeed-gafix in one command, with a dated record.

On a machine with a CUDA GPU, the fork installed in the interpreter that runs this (or --fork-python) and
pristine upstream in --pristine-python:

    tools/gpu-check --pristine-python "$(tools/test-against-upstream --venv 0.19.8)"
    tools/gpu-check --dry-run        # lists the checks, checks that their scripts and options exist (no GPU)

Each check runs one command and is judged by a stated criterion; the record (record.json, record.md and
one log per check) goes to --out (default build/gpu-check/<date>). Exit status 0 when every check that
ran passed and none was left out for a missing input. --only/--skip pick checks by name.
"""

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from toolkit import REPO, junit, options, tables

UPSTREAM_TESTS = REPO.parent / "shared" / "deepspeed-tests"

# The config of the H100 failure of bf16 ZeRO-2 with FusedAdam (docs/evidence/gas_check.md), checked on one GPU.
BF16_FUSED_ADAM = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 4,
    "bf16": {
        "enabled": True
    },
    "zero_optimization": {
        "stage": 2
    },
    "optimizer": {
        "type": "Adam",
        "params": {
            "lr": 1e-3
        }
    },
    "gradient_clipping": 1.0,
}
# SuperOffload (CUDA only): ZeRO-3 with the optimizer on the CPU, whose step runs speculatively before the norm is
# known and is rolled back when clipping applies: a clipping threshold below the norm makes every step take that path.
SUPER_OFFLOAD = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 4,
    "bf16": {
        "enabled": True
    },
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {
            "device": "cpu",
            "super_offload": True
        }
    },
    "optimizer": {
        "type": "Adam",
        "params": {
            "lr": 1e-3
        }
    },
    "gradient_clipping": 0.1,
}


def deepcompile(stage):
    """DeepCompile (CUDA and NCCL only): its compiled backward reduces and partitions the gradients itself, with
    the ZeRO pass of ``stage``; clipping below the norm."""
    return {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 4,
        "bf16": {
            "enabled": True
        },
        "zero_optimization": {
            "stage": stage
        },
        "compile": {
            "deepcompile": True
        },
        "optimizer": {
            "type": "Adam",
            "params": {
                "lr": 1e-3
            }
        },
        "gradient_clipping": 0.1,
    }


# The configs the ds_gas_check checks read, written into the record's folder.
GAS_CHECK_CONFIGS = {
    "bf16_fused_adam.json": BF16_FUSED_ADAM,
    "superoffload.json": SUPER_OFFLOAD,
    "deepcompile_zero1.json": deepcompile(1),
    "deepcompile_zero3.json": deepcompile(3),
}
# Step time per model: ZeRO-2 and ZeRO-3 at GAS 1 and 8, fresh workers per config, five alternating rounds
# (on an H100: GPT-2 125M ~3.5 min; Llama 1B ~4 min). On a fresh machine give step-counts 5 minutes and
# gas-check a few: their first use JIT-compiles the CPU Adam and FusedAdam ops.
STEP_TIME_CONFIGS = ["z2_bf16_gas1", "z2_bf16_gas8", "z3_bf16_gas1", "z3_bf16_gas8"]
STEP_TIME_MODELS = {"gpt2-125m": 5, "llama-1b": 3}  # model -> timed steps per side and round
STEP_TIME_ROUNDS = 5  # alternating fork/pristine rounds: two could not tell 0.97x from 1.24x
NORM_OF_COPY = 0.90  # the fused norm reads each byte once: at least 90% of a copy's bandwidth
STEP_RATIO = 1.00  # fork/pristine step time: no slower than pristine within the rounds' spread


@dataclass
class Check:
    name: str
    what: str
    criterion: str
    argv: list  # "{fork}", "{pristine}", "{out}", "{tests}" are filled in
    needs: tuple = ()  # "pristine", "upstream-tests"
    judge: object = None  # (returncode, out_dir) -> (passed, detail)
    options: dict = field(default_factory=dict)  # script -> options its --help must list (dry run)
    timeout: int = 1800


def pytest_outcomes(xml_path):
    """name -> "passed" | "failed" | "skipped" from a JUnit XML file (an error counts as failed)."""
    return {case.name: "failed" if case.outcome == "error" else case.outcome for case in junit.cases(xml_path)}


def judge_pytest(xml_name, must_run):
    """Exit 0, nothing failed, and every test whose name contains ``must_run`` ran (not skipped)."""

    def judge(returncode, out):
        path = out / xml_name
        if not path.exists():
            return False, f"no test report (exit {returncode})"
        outcomes = pytest_outcomes(path)
        counts = {kind: sum(1 for o in outcomes.values() if o == kind) for kind in ("passed", "failed", "skipped")}
        skipped = sorted(name for name, o in outcomes.items() if must_run in name and o == "skipped")
        failed = sorted(name for name, o in outcomes.items() if o == "failed")
        detail = ", ".join(f"{n} {kind}" for kind, n in counts.items())
        if failed:
            detail += "; failed: " + ", ".join(failed)
        if skipped:
            detail += "; skipped though they need a GPU: " + ", ".join(skipped)
        return returncode == 0 and not failed and not skipped and counts["passed"] > 0, detail

    return judge


def judge_norm_bandwidth(returncode, out):
    path = out / "norm-bandwidth.json"
    if returncode != 0 or not path.exists():
        return False, f"exit {returncode}"
    rows = json.loads(path.read_text().strip().splitlines()[-1])["rows"]
    cells, ok = [], True
    for row in rows:
        fused = row["bytes"] / row["fused op"]["seconds"]
        copy = 2 * row["bytes"] / row["copy"]["seconds"]
        share = fused / copy
        ok = ok and share >= NORM_OF_COPY and row["fused op"]["rel_error"] <= 1e-6
        cells.append(f"{row['model']} {row['dtype']} {share:.0%} of copy (err {row['fused op']['rel_error']:.0e})")
    return ok, "; ".join(cells)


def judge_host_time(returncode, out):
    path = out / "norm-host-time.json"
    if returncode != 0 or not path.exists():
        return False, f"exit {returncode}"
    rows = json.loads(path.read_text())
    # Rows come in pairs per set: "without plan", then "with plan".
    ratios = [after["host_us"] / before["host_us"] for before, after in zip(rows[0::2], rows[1::2])]
    return max(ratios) < 1.0, f"with plan / without: {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} sets"


def judge_step_time(json_name):
    """Every config's fork/pristine ratio at most STEP_RATIO within its rounds' spread (the lowest round's), and no
    config failed or was left out."""

    def judge(returncode, out):
        path = out / json_name
        if returncode != 0 or not path.exists():
            return False, f"exit {returncode}"
        record = json.loads(path.read_text())
        rows = record["rows"]
        errors = [row["config"] for row in rows if "errors" in row]
        ratios = {row["config"]: row for row in rows if "ratio" in row}
        detail = ", ".join(f"{name} {row['ratio']:.3f} ({row['ratio_spread'][0]:.3f}-{row['ratio_spread'][1]:.3f})"
                           if "ratio_spread" in row else f"{name} {row['ratio']:.3f}" for name, row in ratios.items())
        if errors:
            detail += "; errors in " + ", ".join(errors)
        if record.get("configs_left"):
            detail += "; not run: " + ", ".join(record["configs_left"])
        slower = [name for name, row in ratios.items() if row.get("ratio_spread", [row["ratio"]])[0] > STEP_RATIO]
        if slower:
            detail += "; slower than pristine in every round: " + ", ".join(slower)
        passed = not errors and bool(ratios) and not slower and not record.get("configs_left")
        return passed, "fork/pristine: " + detail

    return judge


def judge_step_counts(returncode, out):
    """The fork asks no more of the host or the device between boundaries than pristine, on every config."""
    path = out / "step-counts.json"
    if returncode != 0 or not path.exists():
        return False, f"exit {returncode}"
    sides = json.loads(path.read_text())
    costlier = []
    for name, ours in sides["fork"]["configs"].items():
        theirs = sides["pristine"]["configs"].get(name, {})
        if "error" in ours or "error" in theirs:
            costlier.append(f"{name} (error)")
            continue
        pairs = [(ours["non_boundary"], theirs["non_boundary"])]
        if "device" in ours and "device" in theirs:
            pairs.append((ours["device"]["non_boundary"], theirs["device"]["non_boundary"]))
        for mine, upstream in pairs:
            if mine is None:  # a pipeline's step is counted whole: no micro-step apart
                continue
            costlier += [
                f"{name} {key} {mine[key]:g} > {upstream[key]:g}" for key in ("aten", "launches")
                if key in mine and mine[key] > upstream[key]
            ]
    profiled = sum("device" in ours for ours in sides["fork"]["configs"].values())
    detail = f"{len(sides['fork']['configs'])} configs, {profiled} with device counts"
    return not costlier, detail + ("; costlier: " + ", ".join(costlier) if costlier else "; none costlier")


def judge_exit(returncode, out):
    return returncode == 0, f"exit {returncode}"


def pytest_check(name, what, criterion, test_file):
    """A test file of ours on the GPU, judged by its JUnit outcomes (no CUDA case may skip)."""
    return Check(
        name,
        f"{what} ({test_file})",
        criterion,
        ["{fork}", "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", test_file, f"--junitxml={{out}}/{name}.xml"],
        judge=judge_pytest(f"{name}.xml", "cuda"))


def judge_fixed(report_name):
    """tools/run-upstream-suite's report: every test it ran fails on pristine and passes on the fork."""

    def judge(returncode, out):
        path = out / report_name
        if not path.exists():
            return False, f"no report (exit {returncode})"
        tests = json.loads(path.read_text())["tests"]
        categories = sorted({row["category"] for row in tests.values()})
        outcomes = ", ".join(f"{test_id.split('::')[-1]}: pristine {row['pristine']['outcome']}, fork "
                             f"{row['fork']['outcome']}" for test_id, row in tests.items())
        return bool(tests) and categories == ["fixed"], outcomes or "no test ran"

    return judge


def gas_check(name, what, config_file):
    """ds_gas_check on one GPU with one of GAS_CHECK_CONFIGS, written into the record's folder."""
    return Check(name,
                 f"ds_gas_check, {what}, one GPU",
                 "ds_gas_check exits 0 (every split PASS)",
                 ["ds_gas_check", "--config", f"{{out}}/{config_file}", "--ranks", "1"],
                 judge=judge_exit,
                 options={"ds_gas_check": ["--config", "--ranks"]})


def checks():
    """Every check, in the order they run."""
    py = "{fork}"
    return [*correctness_checks(py), *deepcompile_checks(py), *speed_checks(py), *upstream_checks(py)]


def correctness_checks(py):
    """The fused norm, the engine paths and ZeRO++'s quantizer on the GPU, and ds_gas_check on GPU-only paths."""
    return [
        pytest_check("fused-norm", "the fused_norm op on the GPU vs fp64", "pytest passes; no CUDA test skipped",
                     "tests/test_fused_norm.py"),
        pytest_check("cuda-engines", "16 engine paths on the GPU vs fp64, incl. fp16",
                     "pytest passes; no case skipped", "tests/test_cuda_engines.py"),
        pytest_check("quantizer-wire-format", "ZeRO++'s CUDA quantizer vs the pure-torch one the CPU tests run",
                     "pytest passes; no CUDA test skipped", "tests/test_quantizer_wire.py"),
        gas_check("gas-check-bf16-fused-adam", "bf16 ZeRO-2 with FusedAdam", "bf16_fused_adam.json"),
        gas_check("gas-check-superoffload",
                  "bf16 ZeRO-3 SuperOffload (a speculative CPU step, rolled back under clipping)",
                  "superoffload.json"),
    ]


def deepcompile_checks(py):
    """DeepCompile: ds_gas_check on its passes, its patches' upstream-style tests, its native op."""
    return [
        gas_check("gas-check-deepcompile-zero1", "bf16 DeepCompile with its ZeRO-1 pass", "deepcompile_zero1.json"),
        Check("deepcompile-patch-tests",
              "the upstream-style tests of the patches Flush-only-the-DeepCompile-reduce-buckets-that-hold- "
              "(DeepCompile ZeRO-1 at GAS 2, two steps) and Refuse-gradients-DeepCompile-s-ZeRO-1-2-backward-wou (a "
              "head under torch.compiler.disable) on the fork and on pristine",
              "each fails on pristine and passes on the fork", [
                  py, "tools/run-upstream-suite", "--tier", "patch-tests", "--files",
                  "unit/v1/compile/test_deepcompile_zero1_accumulation.py",
                  "unit/v1/compile/test_deepcompile_unreduced_gradients.py", "--local-size", "0", "--tests", "{tests}",
                  "--fork-python", "{fork}", "--pristine-python", "{pristine}", "--work-dir",
                  "{out}/deepcompile-patch-tests", "--report", "{out}/deepcompile-patch-tests.md"
              ],
              needs=("pristine", "upstream-tests"),
              judge=judge_fixed("deepcompile-patch-tests.json"),
              options={"tools/run-upstream-suite": ["--tier", "--files", "--local-size", "--tests"]},
              timeout=900),
        Check("deepcompile-native",
              "DeepCompile's ZeRO-1/2/3 passes with its native op, the cases tests/test_deepcompile.py runs with the "
              "op's torch stand-in on a CPU (1 rank)",
              "pytest passes (norm and update against fp64 at every split)", [
                  "env", "DS_TEST_DEEPCOMPILE_NATIVE=1", py, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA",
                  "tests/test_deepcompile.py", "--run-slow", "-k", "1ranks", "--junitxml={out}/deepcompile-native.xml"
              ],
              judge=judge_pytest("deepcompile-native.xml", "cuda")),
        gas_check("gas-check-deepcompile-zero3", "bf16 DeepCompile with its ZeRO-3 pass", "deepcompile_zero3.json"),
    ]


def speed_checks(py):
    """The norm's bandwidth and host time, the step time and the counted step cost against pristine."""
    return [
        Check("norm-bandwidth",
              "fused norm vs a copy, GPT-2 125M/350M gradient sets (benchmarks/grad_norm_speed.py)",
              f"every set at least {NORM_OF_COPY:.0%} of the copy bandwidth, relative error <= 1e-6",
              [py, "benchmarks/grad_norm_speed.py", "--device", "cuda", "--json"],
              judge=judge_norm_bandwidth,
              options={"benchmarks/grad_norm_speed.py": ["--device", "--json"]}),
        Check("norm-host-time",
              "host time of a norm call without and with its plan (benchmarks/norm_host_time.py)",
              "with the plan faster on every set", [
                  py, "benchmarks/norm_host_time.py", "--device", "cuda", "--repeat", "5", "--inner", "200", "--json",
                  "{out}/norm-host-time.json"
              ],
              judge=judge_host_time,
              options={"benchmarks/norm_host_time.py": ["--device", "--json"]}),
        *(Check(f"step-time-{model}",
                f"training step, {model} bf16 ZeRO-2/3 at GAS 1 and 8 on one GPU, fork vs pristine, with kernel "
                "launches and device time (benchmarks/step_time.py)",
                f"fork/pristine at most {STEP_RATIO} within the rounds' spread on every config", [
                    py, "benchmarks/step_time.py", "--fork-python", "{fork}", "--pristine-python", "{pristine}",
                    "--ranks", "1", "--model", model, "--configs", *STEP_TIME_CONFIGS, "--repeat",
                    str(STEP_TIME_ROUNDS), "--steps",
                    str(steps), "--warmup", "2", "--profile", "--extensions-dir", "{out}/bench-extensions",
                    "--work-dir", f"{{out}}/step-time-{model}", "--json", f"{{out}}/step-time-{model}.json"
                ],
                needs=("pristine", ),
                judge=judge_step_time(f"step-time-{model}.json"),
                options={
                    "benchmarks/step_time.py": [
                        "--fork-python", "--pristine-python", "--ranks", "--model", "--configs", "--repeat", "--steps",
                        "--profile", "--json"
                    ]
                }) for model, steps in STEP_TIME_MODELS.items()),
        Check("step-counts",
              "ATen ops, host reads, collectives, kernel launches and device time per micro-step, fork vs pristine "
              "(benchmarks/step_counts.py)",
              "the fork's non-boundary micro-step no costlier than pristine's on every config", [
                  py, "benchmarks/step_counts.py", "--fork-python", "{fork}", "--pristine-python", "{pristine}",
                  "--extensions-dir", "{out}/bench-extensions", "--json", "{out}/step-counts.json"
              ],
              needs=("pristine", ),
              judge=judge_step_counts,
              options={"benchmarks/step_counts.py": ["--fork-python", "--pristine-python", "--json"]}),
    ]


def upstream_checks(py):
    """Upstream's GPU tier, fork vs pristine."""
    return [
        Check("upstream-gpu-tier",
              "upstream's half_precision and hybrid_engine tests and the patch tier on the GPU, fork vs pristine",
              "tools/run-upstream-suite exits 0 (no regression)", [
                  py, "tools/run-upstream-suite", "--tier", "gpu", "--local-size", "0", "--tests", "{tests}",
                  "--fork-python", "{fork}", "--pristine-python", "{pristine}", "--work-dir", "{out}/upstream-gpu",
                  "--report", "{out}/upstream-gpu.md"
              ],
              needs=("pristine", "upstream-tests"),
              judge=judge_exit,
              options={"tools/run-upstream-suite": ["--tier", "--local-size", "--tests", "--pristine-python"]},
              timeout=7200),
    ]


def fill(argv, values):
    return [arg.format(**values) for arg in argv]


def missing_inputs(check, args):
    missing = []
    if "pristine" in check.needs and not args.pristine_python:
        missing.append("--pristine-python")
    if "upstream-tests" in check.needs and not Path(args.upstream_tests).is_dir():
        missing.append(f"upstream's tests ({args.upstream_tests})")
    return missing


def executable(name, fork):
    """A console script of the fork's interpreter (beside it), else on PATH."""
    beside = Path(fork).with_name(name)
    return str(beside) if beside.exists() else shutil.which(name)


def dry_run(selected, args):
    """Each check's scripts exist and their --help lists the options it passes; nothing else runs."""
    from upstream_suite.patch_tests import patch_tests
    patch_test_paths = {test.path for test in patch_tests(sorted((REPO / "patches").glob("[0-9]*.patch")))}
    problems = []
    for check in selected:
        print(f"{check.name}: {check.what}\n    criterion: {check.criterion}\n    needs: "
              f"{', '.join(check.needs) or 'the GPU only'}")
        for arg in check.argv:
            if arg.startswith("unit/"):  # a test a patch adds to upstream's tests (the patch-tests tier)
                if arg not in patch_test_paths:
                    problems.append(f"{check.name}: no patch adds the test {arg}")
            elif arg.endswith(".py") or arg.startswith("tools/"):
                if not (REPO / arg).exists():
                    problems.append(f"{check.name}: {arg} does not exist")
        for script, listed in check.options.items():
            if script.startswith(("benchmarks/", "tools/")):
                cmd = [args.fork_python, str(REPO / script), "--help"]
            else:
                found = executable(script, args.fork_python)
                if not found:
                    problems.append(f"{check.name}: no '{script}' beside {args.fork_python} or on PATH")
                    continue
                cmd = [found, "--help"]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
            absent = [opt for opt in listed if opt not in proc.stdout]
            if proc.returncode != 0 or absent:
                problems.append(f"{check.name}: `{' '.join(cmd[-2:])}` exit {proc.returncode}, options not listed: "
                                f"{absent}")
    for problem in problems:
        print(f"gpu-check: {problem}", file=sys.stderr)
    print(f"gpu-check: dry run of {len(selected)} check(s): " +
          ("OK" if not problems else f"{len(problems)} problem(s)"))
    return 1 if problems else 0


def environment(fork):
    code = ("import json, torch, deepspeed; from deepspeed.accelerator import get_accelerator as g; a = g(); "
            "print(json.dumps({'deepspeed': deepspeed.__version__, 'torch': torch.__version__, "
            "'cuda': torch.version.cuda, 'accelerator': a.device_name(), "
            "'device': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))")
    proc = subprocess.run([fork, "-c", code], capture_output=True, text=True, cwd=REPO)
    return json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {"error": proc.stderr[-500:]}


def markdown(record):
    env = record["environment"]
    lines = [
        f"# GPU checks, {record['date']}", "",
        f"deepspeed {env.get('deepspeed')} on {env.get('device')}, torch {env.get('torch')} (CUDA {env.get('cuda')}); "
        f"pristine: {record['pristine_python'] or 'not given'}; TORCH_CUDA_ARCH_LIST={env.get('TORCH_CUDA_ARCH_LIST')}",
        "", "Reproduce: " + "; ".join(f"`{c}`" for c in record["commands"]), "",
        *tables.header(["check", "criterion", "result", "seconds", "detail"], right={"seconds"})
    ]
    for row in record["checks"]:
        lines.append(f"| {row['name']} | {row['criterion']} | {row['result']} | {row.get('seconds', '')} | "
                     f"{row['detail']} |")
    for row in record.get("not_run", []):  # checks a run left out, with the reason (a record may add them)
        lines.append(f"| {row['name']} | | NOT RUN | | {row['why']} |")
    if record.get("tree"):
        lines += ["", f"Tree: {record['tree']}."]
    return "\n".join(lines) + "\n"


def run_check(check, argv, run_env, out):
    """Run one check's command, its output in ``out/<name>.log``; its row: command, result, detail, seconds."""
    started = time.time()
    with open(out / f"{check.name}.log", "w") as log:
        try:
            proc = subprocess.run(argv,
                                  cwd=REPO,
                                  env=run_env,
                                  stdout=subprocess.PIPE,
                                  stderr=log,
                                  text=True,
                                  timeout=check.timeout)
            returncode, stdout = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired as err:
            returncode, stdout = 124, err.stdout or ""
            stdout = stdout if isinstance(stdout, str) else stdout.decode(errors="replace")
        log.write(stdout)
    if check.name == "norm-bandwidth":
        (out / "norm-bandwidth.json").write_text(stdout)
    passed, detail = check.judge(returncode, out)
    return {
        "command": " ".join(argv),
        "result": "PASS" if passed else "FAIL",
        "detail": detail,
        "seconds": round(time.time() - started)
    }


def parse_args(argv):
    """The options, and the checks they select."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="list the checks; check their commands exist")
    options.add_sides(parser)
    parser.add_argument("--upstream-tests",
                        default=os.environ.get("DS_GAFIX_UPSTREAM_TESTS", str(UPSTREAM_TESTS)),
                        help="upstream's tests/ directory (the GPU tier)")
    parser.add_argument("--out", help="where the record goes (default build/gpu-check/<date>)")
    parser.add_argument("--only", nargs="+", help="run only these checks")
    parser.add_argument("--skip", nargs="+", default=[], help="leave these checks out")
    args = parser.parse_args(argv)
    everything = checks()
    names = [c.name for c in everything]
    unknown = [n for n in (args.only or []) + args.skip if n not in names]
    if unknown:
        parser.error(f"unknown check(s) {unknown}; known: {', '.join(names)}")
    return args, [c for c in everything if (not args.only or c.name in args.only) and c.name not in args.skip]


def main(argv=None):
    args, selected = parse_args(argv)
    if args.dry_run:
        return dry_run(selected, args)

    date = datetime.date.today().isoformat()
    out = Path(args.out or REPO / "build" / "gpu-check" / date).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name, config in GAS_CHECK_CONFIGS.items():
        (out / name).write_text(json.dumps(config, indent=1) + "\n")
    env = environment(args.fork_python)
    if not env.get("device"):
        print(f"gpu-check: no CUDA device seen by {args.fork_python}: {env}", file=sys.stderr)
        return 2
    fork_bin = str(Path(args.fork_python).parent)
    values = {
        "fork": args.fork_python,
        "pristine": args.pristine_python or "",
        "out": str(out),
        "tests": args.upstream_tests
    }
    env["TORCH_CUDA_ARCH_LIST"] = os.environ.get("TORCH_CUDA_ARCH_LIST")
    record = {"date": date, "environment": env, "pristine_python": args.pristine_python, "commands": [], "checks": []}
    earlier = out / "record.json"
    if earlier.exists():  # a later run into the same folder adds its checks (a re-run check replaces its row)
        kept = json.loads(earlier.read_text())
        record["commands"] = kept.get("commands", [])
        record["checks"] = [row for row in kept.get("checks", []) if row["name"] not in {c.name for c in selected}]
    record["commands"].append(" ".join(["tools/gpu-check", *(argv if argv is not None else sys.argv[1:])]))
    all_ok = True
    # One extensions directory for the run: the ops JIT-build once, then every check reuses them.
    run_env = dict(os.environ, PATH=fork_bin + os.pathsep + os.environ.get("PATH", ""))
    run_env.setdefault("DS_GAFIX_TEST_EXTENSIONS_DIR", str(out / "extensions"))
    run_env.setdefault("TORCH_EXTENSIONS_DIR", str(out / "extensions"))
    for check in selected:
        row = {"name": check.name, "criterion": check.criterion}
        missing = missing_inputs(check, args)
        if missing:
            row.update(result="NOT RUN", detail="needs " + ", ".join(missing))
            all_ok = False
        else:
            row.update(run_check(check, fill(check.argv, values), run_env, out))
            all_ok = all_ok and row["result"] == "PASS"
        record["checks"].append(row)
        print(f"gpu-check: {check.name}: {row['result']} ({row['detail']})", flush=True)
        (out / "record.json").write_text(json.dumps(record, indent=1) + "\n")
        (out / "record.md").write_text(markdown(record))
    print(markdown(record))
    return 0 if all_ok else 1
