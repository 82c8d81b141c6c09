# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""transformers' and accelerate's own DeepSpeed tests on the fork and on pristine upstream, compared test by test.

    tools/client-tier                                   both sides, every selection; report in docs/evidence/client_tier/
    tools/client-tier --selections transformers-trainer --report /tmp/ct.md
    tools/client-tier --fork-python X --pristine-python Y

The tests are the clients' files in ../shared/client-tests (or --tests), run unchanged from a scratch copy per
side. On a CPU a few things stand between them and DeepSpeed, and this tier removes only those:
- transformers' class gate require_torch_accelerator: tools/client_tier/transformers_cpu_shim.py re-exports the
  classes without it (method gates stay);
- TrainingArguments refuses bf16 without a GPU unless use_cpu is set: the shim sets it (DeepSpeed still runs
  the engine; only the device check changes);
- accelerate's gates require_non_cpu and require_multi_device, and DeepSpeed's CPU accelerator refusing fp16:
  tools/client_tier/cpu_shim/sitecustomize.py, first on PYTHONPATH of every selection but the as-shipped ones, lifts
  them in pytest and in every rank a test launches (2 gloo ranks stand for the devices);
- tiny hub models by name: local stand-ins with random weights (the clients' make_hub_standins.py, and
  tools/client_tier/standins.py for the ones it lacks), written once and shared by both sides, for tests that
  need "a tiny model", not its weights.
What still cannot run on a CPU is deselected with its reason (SELECTIONS) and listed in the report.

Each side runs in its interpreter (pristine: the venv of tools/test-against-upstream, on the fork's torch and
Python), with the same client packages; the outcomes are classified as upstream's suite is
(tools/upstream_suite/classify.py): a regression is a test that passes on pristine and not on the fork. A test the
sides disagree on runs once more on the side that did worse; the second outcome stands, the first is in the report.
Pristine's side can replay its recorded outcomes instead of running (tools/client_tier/baseline.py: --record-baseline,
--pristine-baseline); a record made for other packages or other tests is refused.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from client_tier import baseline
from toolkit import REPO, junit, options, tables
from gafix_build import load_pin
from upstream_suite.baseline import BaselineError, tree_sha256
from upstream_suite.classify import FIXED, REGRESSION, category_counts, compare, side_counts
from toolkit.sides import clean_environ, pristine_python

SHIM = REPO / "tools" / "client_tier" / "transformers_cpu_shim.py"
CPU_SHIM = REPO / "tools" / "client_tier" / "cpu_shim"
REQUIREMENTS = REPO / "tools" / "client_tier" / "requirements.txt"


@dataclass
class Selection:
    name: str
    client: str  # the tree under the client tests, where pytest runs
    paths: list
    keyword: str = ""
    # -k terms left out, each with why it cannot run on a CPU.
    not_on_cpu: dict = field(default_factory=dict)
    # A folder put first on PYTHONPATH of pytest and of what it launches (a sitecustomize.py shim), if any.
    shim_path: Path = None


SELECTIONS = [
    Selection("transformers-trainer",
              "transformers", ["tests/trainer/distributed/test_ds_cpu_shim.py::TestDSCpu"],
              not_on_cpu={
                  "nvme": "ZeRO-Infinity NVMe offload needs libaio and an NVMe path",
                  "hyperparameter": "needs optuna",
                  "load_best_model": "loads a T5 tokenizer from the hub (its fixture is not in the client files)",
              },
              shim_path=CPU_SHIM),
    Selection("transformers-non-trainer",
              "transformers", ["tests/trainer/distributed/test_ds_cpu_shim.py::TestDSCpuNonTrainer"],
              shim_path=CPU_SHIM),
    # The file as shipped: its class gates skip every test on a CPU (counted, so nothing is hidden).
    Selection("transformers-as-shipped", "transformers",
              ["tests/trainer/distributed/test_trainer_distributed_deepspeed.py"]),
    Selection("accelerate",
              "accelerate", ["tests/deepspeed", "tests/test_dataclasses.py"],
              keyword="deepspeed or DeepSpeed",
              not_on_cpu={
                  "test_basic_run":
                  "launches accelerate's test_performance.py, which needs the evaluate package, "
                  "distilbert-base-uncased and the GLUE MRPC dataset from the hub",
              },
              shim_path=CPU_SHIM),
    # The files as shipped, without the shim: their device gates skip nearly every test on a CPU.
    Selection("accelerate-as-shipped",
              "accelerate", ["tests/deepspeed", "tests/test_dataclasses.py"],
              keyword="deepspeed or DeepSpeed"),
]


def keyword_of(selection, terms, extra=""):
    parts = [f"({keyword})" for keyword in (selection.keyword, extra) if keyword]
    parts += [f"not {term}" for term in terms]
    return " and ".join(parts)


def scratch_tree(tests, work_dir, side):
    """A copy of the client tests for one side, with the shim beside transformers' test file."""
    tree = work_dir / side / "client-tests"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(tests, tree)
    shutil.copy(SHIM, tree / "transformers" / "tests" / "trainer" / "distributed" / "test_ds_cpu_shim.py")
    # Each client's tree is pytest's rootdir (test ids alike on both sides), not a directory above the scratch copy
    # whose settings would apply to the clients' tests.
    for client in ("transformers", "accelerate"):
        (tree / client / "pytest.ini").write_text("[pytest]\n")
    return tree


def side_env(python, work_dir, side, hf_home, extensions_dir=None, shim_path=None):
    env = clean_environ()
    # Tests launch the side's console scripts by name (accelerate launch): its bin folder comes first.
    env["PATH"] = os.pathsep.join([str(Path(python).parent), env.get("PATH", os.defpath)])
    if shim_path:
        env["PYTHONPATH"] = str(shim_path)
    env.update(DS_ACCELERATOR="cpu",
               HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_OFFLINE="1",
               HF_HOME=str(hf_home),
               OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "2"),
               TORCH_EXTENSIONS_DIR=str(extensions_dir or work_dir / side / "torch_extensions"))
    return env


def junit_tests(path, prefix):
    """{test id: {outcome, reason}} from pytest's JUnit XML."""
    return {
        f"{prefix}{case.classname}::{case.name}": {
            "outcome": case.outcome,
            "reason": case.message.splitlines()[0][:300] if case.message else ""
        }
        for case in junit.cases(path)
    }


def collected(python, tree, selection, keyword, env):
    """Test ids pytest collects for the selection with ``keyword`` (no run)."""
    args = [python, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", *selection.paths]
    if keyword:
        args += ["-k", keyword]
    proc = subprocess.run(args, cwd=tree / selection.client, env=env, stdout=subprocess.PIPE, text=True)
    return [line for line in proc.stdout.splitlines() if "::" in line]


def run_selection(python, tree, selection, keyword, env, log_dir, timeout, targets=None, name=None):
    """Run the selection's tests (or ``targets``, pytest node ids) on one side; {test id: {outcome, reason}}."""
    name = name or selection.name
    junit = log_dir / f"{name}.xml"
    junit.unlink(missing_ok=True)
    args = [python, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}", *(targets or selection.paths)]
    if keyword:
        args += ["-k", keyword]
    started = time.time()
    with open(log_dir / f"{name}.log", "w") as log:
        try:
            subprocess.run(args,
                           cwd=tree / selection.client,
                           env=env,
                           stdout=log,
                           stderr=subprocess.STDOUT,
                           timeout=timeout)
        except subprocess.TimeoutExpired:
            log.write(f"\nclient-tier: timed out after {timeout} s\n")
    seconds = round(time.time() - started)
    if not junit.exists():
        return {}, seconds
    return junit_tests(junit, f"{selection.client}/"), seconds


def node_id(client_tree, test_id):
    """pytest's node id of a JUnit test id (``client/dotted.module.Class::name``), or None when no file matches."""
    classname, name = test_id.split("/", 1)[1].rsplit("::", 1)
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        module = Path(*parts[:end]).with_suffix(".py")
        if (client_tree / module).is_file():
            return "::".join([module.as_posix(), *parts[end:], name])
    return None


def rerun_disagreements(results, sides, trees, selection, envs, work_dir, timeout):
    """Run once more, on the side that did worse, each test the sides disagree on (a regression or a fix): a rank
    crashing at exit must not read as either side's doing. The second outcome stands; the first is returned."""
    worse = {"fork": [], "pristine": []}
    for row in compare(results["fork"], results["pristine"]):
        side = {REGRESSION: "fork", FIXED: "pristine"}.get(row.category)
        if side and row.test_id in results[side]:
            worse[side].append(row.test_id)
    reruns = []
    for side, test_ids in worse.items():
        if side not in sides:  # a replayed record: its outcome, settled when it was recorded, stands
            continue
        nodes = {node_id(trees[side] / selection.client, test_id): test_id for test_id in test_ids}
        nodes.pop(None, None)
        if not nodes:
            continue
        again, _ = run_selection(sides[side], trees[side], selection, "", envs[side], work_dir / side, timeout,
                                 list(nodes), f"{selection.name}-rerun")
        for test_id in nodes.values():
            if test_id in again:
                reruns.append({
                    "test_id": test_id,
                    "side": side,
                    "first": results[side][test_id],
                    "again": again[test_id]
                })
                results[side][test_id] = again[test_id]
    return reruns


def install_requirements(python):
    subprocess.run([python, "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)], check=True)


# What a side's outcomes depend on besides deepspeed, in the order probe_versions reports them after it.
PACKAGES = ("torch", "python", "pytest", "transformers", "accelerate", "datasets")


def probe_versions(python):
    """[deepspeed, *PACKAGES] versions of the interpreter, its client requirements installed first."""
    install_requirements(python)
    probe = subprocess.run([
        python, "-c", "import sys, importlib.metadata as md, torch, deepspeed; print(deepspeed.__version__, "
        "torch.__version__, '%d.%d' % sys.version_info[:2], *(md.version(name) for name in "
        "('pytest', 'transformers', 'accelerate', 'datasets')))"
    ],
                           stdout=subprocess.PIPE,
                           text=True,
                           check=True)
    return probe.stdout.split()[-1 - len(PACKAGES):]


def identity_of(fork_versions, tests, keyword):
    """What pristine's outcomes depend on (client_tier.baseline.KEYS): the fork side's probe_versions (the sides'
    packages must agree), the pin, the client tests tree and the -k expression."""
    pin = load_pin(REPO)
    return dict(zip(PACKAGES, fork_versions[1:]),
                pin_sha256=pin.sha256,
                pristine_version=pin.version,
                tests_sha256=tree_sha256(tests),
                keyword=keyword)


def write_report(summary, path):
    # The JSON keeps its keys sorted: selections in SELECTIONS' order and reasons sorted, so --report-only writes what
    # the run wrote.
    order = [selection.name for selection in SELECTIONS]
    selections = dict(sorted(summary["selections"].items(), key=lambda item: order.index(item[0])))
    lines = [
        "# Client tier: transformers' and accelerate's DeepSpeed tests, fork vs pristine", "",
        f"Generated by `tools/client-tier` ({summary['date']}; torch {summary['torch']}, Python {summary['python']},"
        f" transformers {summary['transformers']}, accelerate {summary['accelerate']},"
        f" fork {summary['fork_version']}, pristine {summary['pristine_version']}"
        f"{'; pristine replayed from ' + summary['pristine_record'] if summary.get('pristine_record') else ''}).", "",
        *tables.header([
            "selection", "collected", "run (fork / pristine)", "passed", "failed", "skipped", "regressions", "fixed",
            "time (fork / pristine)"
        ])
    ]
    for name, sel in selections.items():
        fork, pristine = sel["sides"]["fork"], sel["sides"]["pristine"]
        lines.append(f"| {name} | {sel['collected']} | {fork['run']} / {pristine['run']} | "
                     f"{fork['passed']} / {pristine['passed']} | {fork['failed']} / {pristine['failed']} | "
                     f"{fork['skipped']} / {pristine['skipped']} | {sel['categories'][REGRESSION]} | "
                     f"{sel['categories']['fixed']} | {sel['seconds']['fork']} s / {sel['seconds']['pristine']} s |")
    lines += ["", "Counts per side are fork / pristine.", ""]
    for title, key in (("Regressions", "regressions"), ("Fixed on the fork", "fixed"), ("Passing on neither side",
                                                                                        "both_fail")):
        rows = [row for sel in selections.values() for row in sel[key]]
        lines += [f"## {title} ({len(rows)})", ""]
        lines += [f"- `{row['test_id']}`: {row['reason']}" for row in rows] or ["None."]
        lines.append("")
    reruns = [row for sel in selections.values() for row in sel["reruns"]]
    lines += [
        f"## Run twice ({len(reruns)})", "",
        "A test the sides disagree on runs once more on the side that did worse; the second outcome stands.", ""
    ]
    lines += [
        f"- `{row['test_id']}`, {row['side']}: {row['first']['outcome']} ({row['first']['reason'][:120]}), then "
        f"{row['again']['outcome']}" for row in reruns
    ] or ["None."]
    lines.append("")
    lines += ["## Not run on a CPU, and why", ""]
    for name, sel in selections.items():
        for reason, tests in sorted(sel["not_run"].items()):
            lines.append(f"- {name}, {len(tests)} test(s): {reason}: " + ", ".join(f"`{test.rsplit('::', 1)[-1]}`"
                                                                                   for test in tests))
        for reason, count in sorted(sel["skip_reasons"].items()):
            lines.append(f"- {name}, {count} test(s) skipped by the test itself: {reason}")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines) + "\n")


def parse_args():
    parser = argparse.ArgumentParser(prog="client-tier", description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=Path, default=REPO.parent / "shared" / "client-tests")
    options.add_sides(parser,
                      pristine_help="the side compared with: default pristine upstream (tools/test-against-upstream's "
                      "venv on the fork's torch); another build of the fork works too, such as the last release")
    parser.add_argument("--selections", nargs="+", choices=[s.name for s in SELECTIONS])
    parser.add_argument("--work-dir", type=Path, default=REPO / "build" / "client-tier")
    parser.add_argument("--report", type=Path, default=REPO / "docs" / "evidence" / "client_tier" / "report.md")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per selection and side")
    parser.add_argument("--fork-extensions-dir",
                        type=Path,
                        help="TORCH_EXTENSIONS_DIR of the fork side (default: one under the work dir); one where "
                        "the same install built its ops already saves their JIT builds. The other side always "
                        "builds in its own (its ops share the fork's names)")
    parser.add_argument("-k",
                        dest="keyword",
                        default="",
                        help="only the tests of the selections that also match this pytest -k expression")
    parser.add_argument("--record-baseline",
                        type=Path,
                        help="write pristine's outcomes of this run there, for --pristine-baseline to replay")
    parser.add_argument("--pristine-baseline",
                        type=Path,
                        nargs="?",
                        const=baseline.DEFAULT,
                        help="replay pristine's recorded outcomes instead of running its side (default record: "
                        f"{baseline.DEFAULT.relative_to(REPO)}); refused when recorded for other packages or tests")
    parser.add_argument("--or-run-pristine",
                        action="store_true",
                        help="with --pristine-baseline: where the record cannot serve, say why and run pristine")
    options.add_report_only(parser)
    args = parser.parse_args()
    if args.record_baseline and args.pristine_baseline:
        parser.error("--record-baseline needs pristine's side run, not replayed")
    return args


class ClientTierError(Exception):
    """The run cannot go on as asked: the message says why (exit status 2)."""


def the_sides(args, chosen):
    """``(sides, versions, identity, recorded)``: each side's interpreter (pristine's only when it runs), their
    versions, the run's identity and pristine's recorded outcomes where they are replayed (else None)."""
    sides = {"fork": os.path.abspath(args.fork_python)}
    versions = {"fork": probe_versions(sides["fork"])}
    identity = identity_of(versions["fork"], args.tests, args.keyword)
    recorded = None
    if args.pristine_baseline:
        try:
            recorded = baseline.load(args.pristine_baseline, identity, [s.name for s in chosen])
        except BaselineError as err:
            if not args.or_run_pristine:
                raise ClientTierError(str(err)) from None
            print(f"client-tier: {err}", file=sys.stderr)
            print("client-tier: running pristine's side instead", file=sys.stderr)
    if recorded is None:
        sides["pristine"] = os.path.abspath(pristine_python(args.pristine_python, sides["fork"]))
        versions["pristine"] = probe_versions(sides["pristine"])
    else:
        versions["pristine"] = [identity["pristine_version"], *versions["fork"][1:]]
    # Only deepspeed may differ: a difference in the clients' versions would read as the fork's.
    if versions["fork"][1:] != versions["pristine"][1:] or "+gafix" not in versions["fork"][0]:
        raise ClientTierError("the sides must be the fork and pristine on one torch, Python, pytest, transformers, "
                              f"accelerate and datasets, not {versions}")
    return sides, versions, identity, recorded


def run_selection_on_both(selection, args, sides, trees, work_dir, hf_home, recorded):
    """One selection run on each side (pristine's replayed where ``recorded``), compared: its summary entry."""
    terms = selection.not_on_cpu
    results, seconds, envs = {}, {}, {}
    for side, python in sides.items():
        envs[side] = side_env(python, work_dir, side, hf_home, args.fork_extensions_dir if side == "fork" else None,
                              selection.shim_path)
        print(f"client-tier: {selection.name} on {side} ...", flush=True)
        results[side], seconds[side] = run_selection(python, trees[side], selection,
                                                     keyword_of(selection, terms, args.keyword), envs[side],
                                                     work_dir / side, args.timeout)
    if recorded:
        results["pristine"] = recorded[selection.name]["outcomes"]
        seconds["pristine"] = recorded[selection.name]["seconds"]
    reruns = rerun_disagreements(results, sides, trees, selection, envs, work_dir, args.timeout)
    env = envs["fork"]
    not_run = {}
    for term, reason in terms.items():
        only_term = keyword_of(selection, [], args.keyword) + f" and ({term})" if (selection.keyword
                                                                                   or args.keyword) else term
        ids = collected(sides["fork"], trees["fork"], selection, only_term, env)
        if ids:
            not_run.setdefault(reason, []).extend(f"{selection.client}/{i}" for i in ids)
    rows = compare(results["fork"], results["pristine"])
    skip_reasons = {}
    for result in results["fork"].values():
        if result["outcome"] == "skipped":
            skip_reasons[result["reason"]] = skip_reasons.get(result["reason"], 0) + 1

    def listed(category):
        return [{"test_id": r.test_id, "reason": r.fork_reason or r.reason} for r in rows if r.category == category]

    return {
        "collected":
        len(collected(sides["fork"], trees["fork"], selection, keyword_of(selection, [], args.keyword), env)),
        "sides": {
            side: side_counts(tests)
            for side, tests in results.items()
        },
        "categories": category_counts(rows),
        "regressions": listed(REGRESSION),
        "fixed": listed("fixed"),
        "both_fail": listed("both fail"),
        "not_run": {
            reason: sorted(set(ids))
            for reason, ids in not_run.items()
        },
        "skip_reasons": skip_reasons,
        "seconds": seconds,
        "reruns": reruns,
        "outcomes": results,
    }


def main():
    args = parse_args()
    if args.report_only:
        write_report(json.loads(args.report.with_suffix(".json").read_text()), args.report)
        return 0
    if not (args.tests / "transformers").is_dir() or not (args.tests / "accelerate").is_dir():
        print(f"client-tier: no client tests at {args.tests} (transformers/ and accelerate/): pass --tests",
              file=sys.stderr)
        return 2
    chosen = [s for s in SELECTIONS if not args.selections or s.name in args.selections]
    try:
        sides, versions, identity, recorded = the_sides(args, chosen)
    except ClientTierError as err:
        print(f"client-tier: {err}", file=sys.stderr)
        return 2
    work_dir = args.work_dir.resolve()
    hf_home = work_dir / "hf_home"
    trees = {side: scratch_tree(args.tests, work_dir, side) for side in sides}
    # One set of stand-ins (random weights) for both sides: each side's models start from the same weights.
    for standins in ([str(args.tests / "make_hub_standins.py")], ["-m", "client_tier.standins"]):
        subprocess.run([sides["fork"], *standins],
                       cwd=REPO / "tools",
                       env=side_env(sides["fork"], work_dir, "fork", hf_home),
                       stdout=subprocess.DEVNULL,
                       check=True)
    summary = {
        "date": time.strftime("%Y-%m-%d"),
        "fork_version": versions["fork"][0],
        "pristine_version": versions["pristine"][0],
        **{
            key: identity[key]
            for key in ("torch", "python", "transformers", "accelerate")
        },
        # The report names the record by its path in the repository where it is one of its files.
        "pristine_record": os.path.relpath(args.pristine_baseline.resolve(), REPO) if recorded else None,
        "selections": {}
    }
    for selection in chosen:
        entry = run_selection_on_both(selection, args, sides, trees, work_dir, hf_home, recorded)
        summary["selections"][selection.name] = entry
        print(f"client-tier: {selection.name}: {json.dumps(entry['categories'])}", flush=True)
    return record_and_report(summary, args, identity)


def record_and_report(summary, args, identity):
    """Record pristine's outcomes (--record-baseline), write the report: the exit status."""
    regressions = sum(len(selection["regressions"]) for selection in summary["selections"].values())
    # A pristine side that timed out or broke must not become what the fork is held to.
    empty = [name for name, selection in summary["selections"].items() if not selection["outcomes"]["pristine"]]
    if args.record_baseline and not empty:
        baseline.record(
            args.record_baseline, identity, {
                name: {
                    "outcomes": selection["outcomes"]["pristine"],
                    "seconds": selection["seconds"]["pristine"]
                }
                for name, selection in summary["selections"].items()
            })
        print(f"client-tier: pristine's outcomes recorded in {args.record_baseline}")
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.with_suffix(".json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    write_report(summary, args.report)
    print(f"client-tier: {regressions} regression(s); report {args.report}")
    if args.record_baseline and empty:
        print(f"client-tier: pristine ran no test of {', '.join(empty)}: nothing recorded", file=sys.stderr)
        return 2
    return 1 if regressions else 0
