# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The fork's suite on every (torch, Python) cell of the supported range, fork vs pristine on the same torch.

    tools/version-matrix                          every cell of CELLS (the release matrix)
    tools/version-matrix --cells 2.15.0@3.11      some cells (torch@python)
    tools/version-matrix --report-only            rewrite the report from the results file

The tree tested is the commit checked out (HEAD), cloned under --dir beside a link to ../shared, as CI
clones it: edits made while the matrix runs do not reach it. Each cell is a venv of its own under --dir (default ~/.cache/deepspeed-gafix/version-matrix), kept between
runs: CUDA builds of torch are GB each. In it: torch==T, the fork from this tree (`pip install .`, as the
README does; DS_GAFIX_UPSTREAM_SDIST is honoured), tests/requirements.txt, then the README's test command
(its pytest arguments read from README.md). The suite's own fork-vs-pristine tests (upstream's patch tier, the op cache,
checkpoints both ways) take pristine 0.19.8 from `tools/test-against-upstream`, whose venv follows the
cell's torch and Python. Results: one entry per cell in --results (JSON), the table in --report (Markdown).

pip's settings are the caller's: a constraint that forbids a cell's torch fails that cell's install (where a
pip configuration caps torch, run with PIP_CONFIG_FILE=/dev/null).
"""

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from toolkit import REPO, junit, options, readme, tables, venvs
from gafix_build.supported import PYTHON, TORCH, tested_range
from patch_tree import git

from toolkit.logs import run_logged
from toolkit.sides import clean_environ

TORCH_RANGE = tested_range()
# The release matrix: the oldest torch upstream's CI installs (2.7.1), the README's (2.13.0), the newest the
# registry serves, on Python 3.11; the oldest and newest Python supported, on the oldest torch.
CELLS = tuple(
    dict.fromkeys((f"{TORCH[0]}@3.11", "2.14.1@3.11", f"{TORCH[-1]}@3.11", f"{TORCH[0]}@{PYTHON[0]}",
                   f"{TORCH[0]}@{PYTHON[-1]}", "2.13.0@3.11")))
PATCH_TIER_TEST = "tests/test_upstream_suite.py::test_patch_tier_has_no_regression"
# Checks README's range against this tool's results (a slow test; deselected in any case): what the matrix
# produces, not what it tests.
CLAIM_TEST = "tests/test_supported_versions.py::test_each_corner_of_the_range_has_a_green_matrix_cell"


def parse_cell(text):
    torch_version, _, python = text.partition("@")
    if not re.fullmatch(r"\d+\.\d+\.\d+", torch_version) or not re.fullmatch(r"3\.\d+", python):
        raise argparse.ArgumentTypeError(f"a cell is TORCH@PYTHON, e.g. 2.15.0@3.11, not {text!r}")
    return torch_version, python


def source_tree(matrix_dir):
    """A clone of HEAD under matrix_dir (kept per commit), with ../shared beside it as in the repository's."""
    commit = git(REPO, "rev-parse", "HEAD").stdout.strip()
    tree = matrix_dir / f"src-{commit[:12]}" / "main"
    if not tree.exists():
        git(REPO, "clone", "-q", str(REPO), str(tree))
        git(tree, "checkout", "-q", commit)
    shared = tree.parent / "shared"
    if not shared.exists() and (REPO.parent / "shared").exists():
        shared.symlink_to(REPO.parent / "shared")
    return tree, commit


def cell_env(venv, cell_dir, matrix_dir):
    env = clean_environ()
    env.update(VIRTUAL_ENV=str(venv),
               PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}",
               TORCH_EXTENSIONS_DIR=str(cell_dir / "torch_extensions"),
               DS_GAFIX_TEST_EXTENSIONS_DIR=str(cell_dir / "torch_extensions"),
               DS_GAFIX_VENV_DIR=str(matrix_dir / "pristine"),
               DS_GAFIX_REQUIRE_HF="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def skip_reasons(outcomes):
    """How many tests skipped for each reason (numbers in a reason folded, so one reason counts once)."""
    counts = {}
    for outcome, message in outcomes.values():
        if outcome == "skipped":
            reason = re.sub(r"\d+", "N", message.splitlines()[0] if message else "")[:120]
            counts[reason] = counts.get(reason, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def junit_outcomes(path):
    """{test id: (outcome, message)} from pytest's JUnit XML (an error counts as failed)."""
    outcomes = {}
    for case in junit.cases(path):
        failed = case.outcome in ("failed", "error")
        outcomes[case.test_id] = ("failed" if failed else case.outcome, case.message[:300 if failed else 200])
    return outcomes


def run_cell(torch_version, python, matrix_dir, tree, pytest_args):
    name = f"torch{torch_version}-py{python}"
    cell_dir = matrix_dir / name
    venv = cell_dir / "venv"
    cell_dir.mkdir(parents=True, exist_ok=True)
    log = cell_dir / "log.txt"
    log.write_text(f"{name}: {datetime.datetime.now().isoformat(timespec='seconds')}\n")
    env = cell_env(venv, cell_dir, matrix_dir)
    started = time.time()
    result = {"torch_requested": torch_version, "python": python}

    def failed(stage):
        errors = [line for line in log.read_text().splitlines() if line.startswith("ERROR:")]
        result.update(stage_failed=stage, seconds=round(time.time() - started))
        if errors:
            result["stage_error"] = errors[-1][len("ERROR:"):].strip()[:300]
        return result

    try:
        base_python = venvs.interpreter(python)
    except venvs.NoInterpreter as err:
        raise SystemExit(f"version-matrix: {err}: a cell names a Python this machine lacks")
    if venvs.create(venv, base_python, log, env, tree):
        return failed("venv")
    for what, args in ((f"pip install torch=={torch_version}", [f"torch=={torch_version}"]),
                       ("pip install . (the fork)", ["."]), ("pip install -r tests/requirements.txt -e tools",
                                                             ["-r", "tests/requirements.txt", "-e", "tools"])):
        if venvs.pip_install(venv, args, log, env, tree)[0]:
            return failed(what)
    probe = subprocess.run(
        [venv / "bin" / "python", "-c", "import torch, deepspeed; print(torch.__version__, deepspeed.__version__)"],
        cwd=cell_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True)
    if probe.returncode:
        result["import_error"] = probe.stdout[-2000:]
        return failed("import torch, deepspeed")
    result["torch"], result["deepspeed"] = probe.stdout.split()[-2:]
    junit = cell_dir / "junit.xml"
    junit.unlink(missing_ok=True)
    rc, _ = run_logged(
        [venv / "bin" / "python", "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}", *pytest_args], log,
        env, tree)
    result.update(pytest_exit=rc, seconds=round(time.time() - started))
    if not junit.exists():
        return failed("pytest (no JUnit XML written)")
    result.update(junit_summary(junit))
    return result


def junit_summary(junit):
    """A cell's outcomes: counts, each failure's message, the skip reasons, and the patch tier's verdict."""
    outcomes = junit_outcomes(junit)
    summary = {
        kind: sum(1 for outcome, _ in outcomes.values() if outcome == kind)
        for kind in ("passed", "failed", "skipped")
    }
    summary["failures"] = {test_id: message for test_id, (outcome, message) in outcomes.items() if outcome == "failed"}
    summary["skip_reasons"] = skip_reasons(outcomes)
    tier = outcomes.get(PATCH_TIER_TEST)
    if tier is None:
        summary["patch_tier"] = "not run"
    elif tier[0] == "passed":
        summary["patch_tier"] = "0 regressions"
    else:
        found = re.search(r"assert (\d+) == 0", tier[1])
        summary["patch_tier"] = f"{found.group(1)} regressions" if found else f"{tier[0]}: {tier[1][:120]}"
    return summary


def drop_venvs(matrix_dir, torch_version, python):
    shutil.rmtree(matrix_dir / f"torch{torch_version}-py{python}" / "venv", ignore_errors=True)
    for venv in (matrix_dir / "pristine").glob(f"upstream-venv-*-py{python}-torch{torch_version}*"):
        shutil.rmtree(venv, ignore_errors=True)


def write_report(results, path):
    rows = [
        *tables.header([
            "torch", "Python", "fork suite: passed / failed / skipped", "upstream patch tier, fork vs pristine",
            "time", "date, commit"
        ])
    ]

    def order(cell):
        return tuple(map(int, cell["torch_requested"].split("."))), tuple(map(int, cell["python"].split(".")))

    for cell in sorted(results.values(), key=order):
        if "stage_failed" in cell:
            suite, tier = f"not run: {cell['stage_failed']} failed", "not run"
        else:
            suite = f"{cell['passed']} / {cell['failed']} / {cell['skipped']}"
            tier = cell["patch_tier"]
        rows.append(f"| {cell.get('torch', cell['torch_requested'])} | {cell['python']} | {suite} | {tier} | "
                    f"{cell['seconds'] // 60} min | {cell['date']}, {cell['commit']} |")
    failures = [
        f"- {cell.get('torch', cell['torch_requested'])}, Python {cell['python']}: `{test_id}`: {message}"
        for cell in results.values() for test_id, message in sorted(cell.get("failures", {}).items())
    ]
    reasons = {}
    for cell in results.values():
        for reason, count in cell.get("skip_reasons", {}).items():
            reasons.setdefault(reason, []).append(count)
    skipped = [f"- {reason}: {min(counts)} to {max(counts)} per cell" for reason, counts in reasons.items()]
    text = [
        "# Version matrix: the fork's suite per torch and Python", "",
        "Generated by `tools/version-matrix` from `docs/evidence/version_matrix/results.json`; each cell: a fresh venv with",
        "that torch, `pip install .`, README's test command. The patch tier runs upstream's tests of the patched",
        "code on the fork and on pristine 0.19.8 with the same torch.", "",
        f"The range README claims, {TORCH_RANGE}, is gafix_build/supported.py's; each of its corners must have a green",
        "cell here (tests/test_supported_versions.py).", "", *rows, ""
    ]
    if failures:
        text += ["Failures:", "", *failures, ""]
    not_run = [
        f"- torch {cell['torch_requested']}, Python {cell['python']}: {cell['stage_failed']}: "
        f"{cell.get('stage_error', 'see the cell log')}" for cell in results.values() if "stage_failed" in cell
    ]
    if not_run:
        text += ["Cells that could not run:", "", *not_run, ""]
    if skipped:
        text += ["Why tests skip (as in CI: the slow tier and the CUDA cases are not run on a CPU):", "", *skipped, ""]
    Path(path).write_text("\n".join(text))


def main():
    parser = argparse.ArgumentParser(prog="version-matrix", description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", type=parse_cell, default=[parse_cell(cell) for cell in CELLS])
    parser.add_argument("--dir", type=Path, default=Path.home() / ".cache" / "deepspeed-gafix" / "version-matrix")
    parser.add_argument("--results", type=Path, default=REPO / "docs" / "evidence" / "version_matrix" / "results.json")
    parser.add_argument("--report", type=Path, default=REPO / "docs" / "evidence" / "version_matrix.md")
    options.add_report_only(parser)
    parser.add_argument("--drop-venvs",
                        action="store_true",
                        help="remove each cell's venvs (fork and pristine) once its results are written: a CUDA "
                        "torch takes about 5 GB per venv, and the release matrix holds 12")
    parser.add_argument("--pytest-args",
                        nargs=argparse.REMAINDER,
                        help="last: pytest's arguments instead of the README's test command's (a quick look at some "
                        "files; such a run is no matrix result: write it elsewhere with --results and --report)")
    args = parser.parse_args()
    results = json.loads(args.results.read_text()) if args.results.exists() else {}
    if not args.report_only:
        args.dir.mkdir(parents=True, exist_ok=True)
        tree, commit = source_tree(args.dir.resolve())
        # The README's test command, as the user types it, less the claim this matrix's results are for.
        pytest_args = args.pytest_args or [*readme.pytest_args(tree / "README.md"), "--deselect", CLAIM_TEST]
        for torch_version, python in args.cells:
            print(f"version-matrix: torch {torch_version}, Python {python} ...", flush=True)
            cell = run_cell(torch_version, python, args.dir.resolve(), tree, pytest_args)
            cell.update(date=datetime.date.today().isoformat(), commit=commit[:12])
            results[f"{torch_version}@{python}"] = cell
            args.results.parent.mkdir(parents=True, exist_ok=True)
            args.results.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
            print(f"version-matrix: {json.dumps({k: v for k, v in cell.items() if k != 'failures'})}", flush=True)
            if args.drop_venvs:
                drop_venvs(args.dir.resolve(), torch_version, python)
    else:
        for key, cell in results.items():  # cells recorded before skip reasons were: read them from their JUnit XML
            junit = args.dir / f"torch{cell['torch_requested']}-py{cell['python']}" / "junit.xml"
            if "skip_reasons" not in cell and "stage_failed" not in cell and junit.exists():
                cell["skip_reasons"] = skip_reasons(junit_outcomes(junit))
        args.results.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    write_report(results, args.report)
    bad = [key for key, cell in results.items() if "stage_failed" in cell or cell.get("failed")]
    return 1 if bad else 0
