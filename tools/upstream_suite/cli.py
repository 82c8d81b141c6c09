# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Run upstream DeepSpeed's own tests on the fork and on pristine upstream, and compare them.

  tools/run-upstream-suite --tier patch                      both sides, then the comparison
  tools/run-upstream-suite --tier patch --pristine-baseline  fork side only, pristine from the recorded baseline
  tools/run-upstream-suite --tier patch --record-baseline    both sides; store pristine's outcomes as the baseline
  tools/run-upstream-suite --files unit/comm/test_dist.py -k broadcast   any selection
  tools/run-upstream-suite --tier patch-tests                both sides: each patch's own upstream-style test
                                                             must fail on pristine and pass on the fork
  tools/run-upstream-suite --tier prefixes                   the PR bundles applied one by one on pristine:
                                                             each patch's test must pass with only the
                                                             patches up to it (tools/upstream_suite/prefixes.py)

Exit status: 0 no regression, 1 at least one regression (patch-tests: a patch's test not failing on
pristine and passing on the fork; prefixes: a patch's test failing on its prefix), 2 a setup error
(named on stderr).
Results resume: rerunning with the same --work-dir skips every test that already has an outcome.
"""

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path

from toolkit import REPO, options, sides
from gafix_build import load_pin
from upstream_suite import (baseline, console_scripts, held_files, patch_tests, prefixes, report, reruns, tiers,
                            work_dir_lock)
from upstream_suite.classify import REGRESSION, compare
from upstream_suite.execute import Side, Unit, run_unit
from upstream_suite.outcomes import OutcomeMismatch, SideOutcomes

TESTS_VAR = "DS_GAFIX_UPSTREAM_TESTS"


class SetupError(Exception):
    """Wrong input: the message names the option, file or interpreter at fault."""


def upstream_tests_dir(given):
    """--tests, else DS_GAFIX_UPSTREAM_TESTS, else ../shared/deepspeed-tests beside the repository."""
    candidates = [given] if given else [os.environ.get(TESTS_VAR), str(REPO.parent / "shared" / "deepspeed-tests")]
    for candidate in candidates:
        if candidate and (Path(candidate) / "unit" / "common.py").is_file():
            return Path(candidate).resolve()
    named = given or os.environ.get(TESTS_VAR) or REPO.parent / "shared" / "deepspeed-tests"
    raise SetupError(f"no upstream tests directory at {named} (set --tests or {TESTS_VAR} to upstream's tests/)")


def describe_python(python):
    """deepspeed and torch versions as the interpreter sees them (run outside any source tree), and which of
    its accelerator's ops this machine can build: that turns on system libraries pip does not install (libaio
    for async_io, so ZeRO-Infinity's NVMe tests), and a test that needs an op skips where it cannot build; and the
    machine's CPU vendor and the dtypes its accelerator supports, which upstream's tests skip on (fp16 where the
    CPU lacks it, cpu_adam's and cpu_lion's half precision on AMD)."""
    probe = ("import json, os, sys, importlib.metadata as md, cpuinfo, deepspeed, torch, pytest; "
             "from deepspeed.accelerator import get_accelerator; "
             "from deepspeed.ops.op_builder.all_ops import ALL_OPS; "
             "print(json.dumps({'deepspeed': deepspeed.__version__, "
             "'torch': torch.__version__, 'pytest': pytest.__version__, 'python': '%d.%d' % sys.version_info[:2], "
             "'package_dir': os.path.dirname(deepspeed.__file__), 'packages': sorted({'%s==%s' % "
             "(d.metadata['Name'].lower(), d.version) for d in md.distributions() if d.metadata['Name'] and "
             "d.metadata['Name'].lower() not in ('deepspeed', 'pip', 'setuptools', 'wheel')}), "
             "'ops': {name: bool(builder.is_compatible(verbose=False)) "
             "for name, builder in sorted(ALL_OPS.items())}, "
             "'machine': {'cpu_vendor': cpuinfo.get_cpu_info().get('vendor_id_raw', '').lower(), "
             "'dtypes': [str(d) for d in get_accelerator().supported_dtypes()]}}))")
    proc = subprocess.run([python, "-c", probe], cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SetupError(
            f"{python} cannot import deepspeed, torch and pytest: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# Written by the build: its git hash and branch. The same code built from another commit, clone or machine
# gives the same outcomes, so it is not hashed (the version label is part of the identity).
BUILD_STAMP = ("git_version_info_installed.py", )


def side_identity(identity, info, package_dir):
    """What one side's outcomes depend on: the tests, the environment and that side's own code (so
    pristine's survive a new fork build, and a rebuilt fork with an unchanged label but other code does
    not resume). The installed packages are kept as a list, so another machine can install the same
    (docs/develop/upstream_suite.md) and a refusal names what differs; the ops this machine can build, so a
    run on a machine without a system library an op needs does not resume one that had it."""
    recorded = {key: identity[key] for key in baseline.KEYS if key != "pristine_version"}
    recorded.update(deepspeed=info["deepspeed"],
                    package_sha256=baseline.tree_sha256(package_dir, leave_out=BUILD_STAMP),
                    packages=list(info["packages"]),
                    ops=dict(info["ops"]),
                    machine=dict(info["machine"]))
    return recorded


def pristine_python(given, fork_python):
    """The pristine interpreter: the one given, or the venv on the fork's torch and Python (toolkit.sides)."""
    try:
        return sides.pristine_python(given, fork_python)
    except sides.PristineNotFound as err:
        raise SetupError(str(err)) from err


def scratch_copy(tests_dir, work_dir, side_name, package_dir, tests_sha256, added=(), copy=0):
    """A copy of the tests laid out as in upstream's repository, for one side.

    Upstream's conftest puts the tests' parent directory on sys.path, so it must hold no deepspeed/
    source, or that, not the installed wheel, is tested. Upstream's repository has op_builder/ and csrc/
    there (test_op_builder.py reads op_builder/builder.py): links to the side's installed copies take
    their place. op_builder/ holds only that file, no package: were it importable, the accelerators would
    take it for a source checkout's op_builder and JIT-build every op from csrc/ by this tree's path, so
    ninja would rebuild each op the installed package built already (about a minute each).
    ``added``: the patches' own test files (patch_tests), laid in beside upstream's. ``copy``: which of
    the side's trees (``--jobs``: one per pytest process running at once, so no test finds files another
    test of its side left in the tree).
    """
    root = work_dir / (f"tree-{side_name}" if not copy else f"tree-{side_name}.{copy + 1}")
    marker = root / "SHA256"
    stamp = f"{tests_sha256} {package_dir} op_builder/builder.py {patch_tests.digest(added)}"
    if not (marker.exists() and marker.read_text() == stamp):
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(tests_dir, root / "tests", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        patch_tests.lay_into(added, root / "tests")
        (root / "op_builder").mkdir()
        (root / "op_builder" / "builder.py").symlink_to(Path(package_dir) / "ops" / "op_builder" / "builder.py")
        (root / "csrc").symlink_to(Path(package_dir) / "ops" / "csrc")
        marker.write_text(stamp)
    return root / "tests"


def series_patches():
    series = REPO / "patches" / "series"
    names = [line.strip() for line in series.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return [REPO / "patches" / name for name in names]


def selected_units(args, tests_dir, added):
    if args.files:
        return [Unit(path, args.keyword or "") for path in args.files]
    if args.tier == "patch-tests":
        return patch_tests.units(added)
    return tiers.units(args.tier, tests_dir)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="run-upstream-suite", description=__doc__.splitlines()[0])
    parser.add_argument("--tier", choices=("patch", "full", "gpu", "patch-tests", "prefixes"), default="patch")
    parser.add_argument("--files", nargs="+", help="test files (relative to the tests dir) instead of a tier")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression for --files")
    parser.add_argument("--tests", help=f"upstream's tests/ directory (default: ${TESTS_VAR}, ../shared/...)")
    options.add_sides(parser)
    parser.add_argument("--pristine-baseline",
                        nargs="?",
                        const="",
                        help="replay pristine's outcomes from this baseline, or from a finished run's "
                        "results-pristine.json (default file: the tier's)")
    parser.add_argument("--record-baseline",
                        nargs="?",
                        const="",
                        help="after running pristine, store its outcomes here (default file: the tier's)")
    parser.add_argument("--only", choices=("fork", "pristine"), help="run one side only (no comparison)")
    parser.add_argument("--work-dir", help="scratch copy, results, logs (default build/upstream-suite/<tier>)")
    parser.add_argument("--results-dir",
                        help="where results-<side>.json live (default: the work dir); keep them to resume a long "
                        "tier in a later run")
    parser.add_argument(
        "--fork-extensions-dir",
        help="TORCH_EXTENSIONS_DIR for the fork side (default <work-dir>/torch_extensions-fork): "
        "one where the same fork install already built its ops saves their JIT builds (minutes "
        "on a CPU; a JIT build lock there that no process holds is removed before each test file: without "
        "/proc, every lock, so nothing else may build in it meanwhile). The pristine side always builds in its "
        "own (its ops share the fork's names)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds one test may run before it is killed")
    parser.add_argument("--jobs",
                        type=int,
                        default=1,
                        help="test files run at once, over both sides (each pytest process in a tree of its own)")
    parser.add_argument("--local-size", type=int, default=8, help="LOCAL_SIZE for the CPU accelerator; 0 on GPUs")
    parser.add_argument("--report", help="Markdown report path (default <work-dir>/report.md; JSON beside it)")
    options.add_report_only(parser,
                            help="run nothing: compare the outcomes recorded so far (units finished on both "
                            "sides)")
    parser.add_argument("--rerun-regressions",
                        action="store_true",
                        help="run the fork side of each current regression once more first (the first outcome "
                        "is kept in reruns-fork.json; a real regression fails twice)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.pristine_baseline is not None and (args.record_baseline is not None or args.only == "pristine"):
        parser.error("--pristine-baseline replays pristine: it cannot be combined with --record-baseline or "
                     "--only pristine")
    if args.rerun_regressions and (args.only or args.report_only or args.pristine_baseline is not None):
        parser.error("--rerun-regressions runs the fork against pristine's recorded outcomes: not with --only, "
                     "--report-only or --pristine-baseline")
    if args.jobs < 1:
        parser.error("--jobs: at least 1")
    if args.jobs > 1 and args.tier == "prefixes" and not args.files:
        parser.error("--jobs: the prefixes tier lays each prefix over the one before: it runs one file at a time")
    if args.jobs > 1 and not held_files.can_tell():
        parser.error("--jobs above 1 needs /proc (Linux): a JIT build lock or /dev/shm buffer left by a killed "
                     "test is told from one a running test holds by the processes that hold it")
    if args.files and (args.pristine_baseline is not None or args.record_baseline is not None):
        parser.error("baselines belong to tiers: use --tier, not --files, with --pristine-baseline/--record-baseline")
    return args


def check_launcher(option, python):
    problem = console_scripts.problem(python)
    if problem:
        raise SetupError(f"{option}: {problem}")


def printer(quiet):
    started = time.monotonic()

    def echo(side, test_id, outcome, duration):
        if not quiet:
            elapsed = time.monotonic() - started
            print(f"[{elapsed:7.0f} s] {side.name:8} {outcome:8} {duration:7.1f} s  {test_id}", flush=True)

    return echo


def run(args):
    work_dir = Path(args.work_dir or REPO / "build" / "upstream-suite" / (args.tier if not args.files else "files"))
    work_dir = work_dir.resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        return run_in(args, work_dir)
    with work_dir_lock.hold(work_dir):
        return run_in(args, work_dir)


def run_in(args, work_dir):
    tests_dir = upstream_tests_dir(args.tests)
    results_dir = Path(args.results_dir).resolve() if args.results_dir else work_dir
    tests_sha256 = baseline.tree_sha256(tests_dir)
    added = patch_tests.patch_tests(series_patches())
    pin = load_pin(REPO)
    if args.tier == "prefixes" and not args.files:
        return run_prefixes(args, tests_dir, work_dir, results_dir, tests_sha256, added, pin)
    units = selected_units(args, tests_dir, added)
    sides, infos, identity = the_sides(args, work_dir, pin, tests_sha256)
    results, trees = {}, {}
    for side in sides:
        # What this side's outcomes depend on: the tests, the environment and this side's own code (so
        # pristine's survive a new fork build, and a rebuilt fork with an unchanged label does not resume).
        results[side.name] = SideOutcomes(results_dir / f"results-{side.name}.json",
                                          side_identity(identity, infos[side.name], side.package_dir))
        if not args.report_only:  # a report touches no tree: a run may be using it
            trees[side.name] = [
                scratch_copy(tests_dir, work_dir, side.name, side.package_dir, tests_sha256, added, copy)
                for copy in range(min(args.jobs, len(units)))
            ]
    if args.rerun_regressions:
        taken = reruns.take_regressions(results["fork"], results["pristine"], results_dir)
        print(f"--rerun-regressions: {len(taken)} fork outcome(s) to run again")
        for test_id in taken:
            print(f"  {test_id}")
    if not args.report_only:
        run_units(units, sides, trees, results, args, work_dir / "logs", printer(args.quiet))

    unit_keys = [unit.key for unit in units]
    if args.report_only:
        unit_keys = [key for key in unit_keys if all(key in outcomes.done_units for outcomes in results.values())]
        print(f"--report-only: {len(unit_keys)} of {len(units)} units finished on every side")
    if args.record_baseline is not None and not args.report_only:
        path = args.record_baseline or baseline.default_path(args.tier)
        baseline.record(path, identity, results["pristine"], unit_keys)
        print(f"pristine baseline recorded: {path}")
    if args.only:
        print(f"{args.only} side done: {len(results[args.only].tests)} outcomes in {results_dir}")
        return 0

    def of_units(outcomes):
        return {test_id: result for test_id, result in outcomes.tests.items() if result["unit"] in unit_keys}

    fork_tests = of_units(results["fork"])
    if args.pristine_baseline is not None:
        pristine_tests, source = replayed_pristine(args, identity, unit_keys, infos["fork"])
    else:
        pristine_tests, source = of_units(results["pristine"]), "run side by side"
    title = f"Upstream tests, {'files' if args.files else args.tier + ' tier'}: fork vs pristine"
    if len(unit_keys) < len(units):
        title += f" ({len(unit_keys)} of {len(units)} test files so far)"
    report_md = Path(args.report) if args.report else work_dir / "report.md"
    regressions = write_comparison(title, identity, fork_tests, pristine_tests, source, results_dir, report_md)
    if args.tier == "patch-tests" and not args.files:
        return patch_test_verdicts(added, fork_tests, pristine_tests, report_md)
    return 1 if regressions else 0


def the_sides(args, work_dir, pin, tests_sha256):
    """``(sides, infos, identity)``: the sides this run executes (pristine's only when it runs, not replayed),
    each interpreter's probe, and what both sides' outcomes depend on. SetupError when the sides cannot be compared."""
    # Interpreters run from other directories: a relative path is taken from here (not resolved: a
    # venv's python is a symlink whose target is outside the venv).
    args.fork_python = os.path.abspath(args.fork_python)
    if args.pristine_python:
        args.pristine_python = os.path.abspath(args.pristine_python)
    fork_info = describe_python(args.fork_python)
    infos = {"fork": fork_info}  # each interpreter is probed once (the probe imports deepspeed: seconds)
    if "+gafix." not in fork_info["deepspeed"]:
        raise SetupError(f"--fork-python {args.fork_python} has deepspeed {fork_info['deepspeed']}, not the fork")
    if args.only != "pristine" and not args.report_only:
        check_launcher("--fork-python", args.fork_python)
    identity = {
        "pin_sha256": pin.sha256,
        "pristine_version": pin.version,
        "fork_version": fork_info["deepspeed"],
        "tests_sha256": tests_sha256,
        "torch": fork_info["torch"],
        "pytest": fork_info["pytest"],
        "python": fork_info["python"],
        "local_size": args.local_size,
    }
    sides = []
    if args.only != "pristine":
        fork_extensions = Path(args.fork_extensions_dir or work_dir / "torch_extensions-fork").resolve()
        sides.append(Side("fork", args.fork_python, fork_extensions, fork_info["package_dir"]))
    if args.only != "fork" and args.pristine_baseline is None:
        infos["pristine"] = pristine_info(args, pin, fork_info)
        sides.append(
            Side("pristine", infos["pristine"]["interpreter"], work_dir / "torch_extensions-pristine",
                 infos["pristine"]["package_dir"]))
    return sides, infos, identity


def pristine_info(args, pin, fork_info):
    """The probe of the pristine interpreter (its path under "interpreter"); SetupError unless it runs pristine
    upstream on the fork's torch, pytest, Python and packages."""
    python = pristine_python(args.pristine_python, args.fork_python)
    info = dict(describe_python(python), interpreter=python)
    if info["deepspeed"] != pin.version:
        raise SetupError(f"--pristine-python {python} has deepspeed {info['deepspeed']}, not pristine "
                         f"{pin.version} (upstream.json)")
    if not args.report_only:
        check_launcher("--pristine-python", python)
    differs = [key for key in ("torch", "pytest", "python") if info[key] != fork_info[key]]
    if differs:
        raise SetupError("the sides differ in " + ", ".join(f"{key} (fork {fork_info[key]}, pristine {info[key]})"
                                                            for key in differs))
    only = sorted(set(info["packages"]) ^ set(fork_info["packages"]))
    if only:
        raise SetupError(
            f"the two interpreters have different packages installed ({', '.join(only[:6])}"
            f"{' ...' if len(only) > 6 else ''}): install the same in both (docs/develop/upstream_suite.md)")
    return info


def replayed_pristine(args, identity, unit_keys, fork_info):
    """Pristine's outcomes from a baseline, and the report's line on where they came from."""
    path = args.pristine_baseline or baseline.default_path(args.tier)
    pristine_tests, recorded_ops, recorded_machine = baseline.load(path, identity, unit_keys, fork_info["ops"],
                                                                   fork_info["machine"])
    source = f"recorded baseline {Path(path).name}"
    if recorded_ops is None:
        source += (" (recorded before baselines kept which ops their machine could build: a test that needs "
                   "a system library, such as async_io's libaio, may differ for that alone; this machine "
                   f"builds {', '.join(name for name, builds in fork_info['ops'].items() if builds)})")
    if recorded_machine is None:
        source += (" (recorded before baselines kept their machine's CPU vendor and dtypes: a test that skips "
                   "without fp16, or on one vendor, may differ for that alone; this machine: "
                   f"{baseline.describe_machine(fork_info['machine'])})")
    return pristine_tests, source


def write_comparison(title, identity, fork_tests, pristine_tests, source, results_dir, report_md):
    """Compare the sides, write the report (Markdown and JSON) and print it: the regressions."""
    from patch_facts import load as load_facts
    rows = compare(fork_tests, pristine_tests, load_facts().explained_outcomes())
    markdown = report.as_markdown(title, identity, rows, fork_tests, pristine_tests, source)
    rerun_line = reruns.summary(results_dir)
    if rerun_line:
        markdown += "\n" + rerun_line + "\n"
    report_md.parent.mkdir(parents=True, exist_ok=True)
    report_md.write_text(markdown)
    report_md.with_suffix(".json").write_text(report.as_json(identity, rows, fork_tests, pristine_tests, source))
    print(markdown)
    regressions = [row for row in rows if row.category == REGRESSION]
    print(f"{len(regressions)} regression(s); report: {report_md} (+ .json)")
    return regressions


def run_units(units, sides, trees, results, args, log_dir, echo):
    """Every unit on every side, interleaved (a run stopped half way compares what it ran), ``--jobs`` pytest
    processes at once: on 2 cores one process leaves about half the machine idle (its ranks wait on each
    other), two keep it busy. Each process takes a tree of its side no other process is using."""
    pairs = [(unit, side) for unit in units for side in sides]
    if args.jobs == 1:
        for unit, side in pairs:
            run_unit(side, unit, trees[side.name][0], results[side.name], args.timeout, log_dir, args.local_size, echo)
        return
    free_trees = {side.name: queue.SimpleQueue() for side in sides}
    for side in sides:
        for tree in trees[side.name]:
            free_trees[side.name].put(tree)

    def run_pair(unit, side):
        tree = free_trees[side.name].get()
        try:
            run_unit(side, unit, tree, results[side.name], args.timeout, log_dir, args.local_size, echo)
        finally:
            free_trees[side.name].put(tree)

    # The pool's threads live until every pair is done: each pytest process dies with the thread that
    # started it (PR_SET_PDEATHSIG), so none is left running alone when the runner dies.
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_pair, unit, side) for unit, side in pairs]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = [future for future in done if future.exception() is not None]
        if failed:
            for future in futures:
                future.cancel()
            raise failed[0].exception()


def patch_test_verdicts(added, fork_tests, pristine_tests, report_md):
    """The patch-tests tier's own verdict: each patch's test fails on pristine and passes on the fork."""
    rows = patch_tests.verdicts(added, fork_tests, pristine_tests)
    table = patch_tests.as_markdown(rows)
    verdicts_md = report_md.with_name("patch-tests.md")
    verdicts_md.write_text(table + "\n")
    print(table)
    unproven = [test.path for test, _, _, ok in rows if not ok]
    print(f"{len(rows) - len(unproven)} of {len(rows)} patch tests fail on pristine and pass on the fork"
          f"{'; not proven: ' + ', '.join(unproven) if unproven else ''}; table: {verdicts_md}")
    return 1 if unproven or not rows else 0


def run_prefixes(args, tests_dir, work_dir, results_dir, tests_sha256, added, pin):
    """The prefixes tier (tools/upstream_suite/prefixes.py): bundle k applied after 1..k-1 on pristine, then
    patch k's own test on that tree, with the pristine interpreter."""
    from patch_tree import apply_mbox
    from patch_facts import load as load_facts

    python, info, tree, bundles = prefixes_base(args, work_dir, pin)
    extensions = Path(args.fork_extensions_dir or work_dir / "torch_extensions-prefixes").resolve()
    wanted = {prefix.number: prefix for prefix in prefixes.prefixes(bundles, added, load_facts().not_for_upstream())}
    echo, rows = printer(args.quiet), []
    for index, bundle in enumerate(bundles):
        proc = apply_mbox(tree, bundle / "pr.mbox")
        if proc.returncode != 0:
            raise SetupError(f"{bundle.name}/pr.mbox does not apply with git am after the bundles before it: "
                             f"{(proc.stderr.strip().splitlines() or ['?'])[0]}")
        prefix = wanted.get(bundle.name[:4])
        if prefix is None:
            continue
        identity = {
            "tests_sha256": tests_sha256,
            "bundles_sha256": prefixes.mbox_digest(bundles[:index + 1]),
            "pristine_python": python,
            "deepspeed": info["deepspeed"],
            "torch": info["torch"],
            "local_size": args.local_size,
        }
        outcomes = SideOutcomes(results_dir / f"results-prefix-{prefix.number}.json", identity)
        todo = [unit for unit in prefixes.units(prefix) if unit.key not in outcomes.done_units]
        if todo and not args.report_only:
            # One path for every prefix: torch keys a JIT build by its sources and include paths, so an op
            # whose sources a prefix leaves alone is not rebuilt (a minute each here).
            site = prefixes.package_copy(tree, work_dir / "site")
            side = prefixes.side_of(prefix, python, site, extensions)
            # Every test file the prefix's bundles add is there, as in the tree: a patch's test may import
            # an earlier patch's (the ZeRO and fp16 norm patches' tests import the norm helper patch's); only the patch's
            # own test runs.
            laid = [test for test in added if test.number <= prefix.number]
            scratch = scratch_copy(tests_dir, work_dir, side.name, side.package_dir, tests_sha256, laid)
            for unit in todo:
                run_unit(side, unit, scratch, outcomes, args.timeout, work_dir / "logs", args.local_size, echo)
        rows.append((prefix, *prefixes.verdict(prefix, outcomes)))
    return report_prefixes(rows, Path(args.report) if args.report else work_dir / "prefixes.md")


def prefixes_base(args, work_dir, pin):
    """The pristine interpreter (it must hold the pinned release), what it holds, the pristine tree checked out at
    the base, and the PR bundles to lay over it."""
    from gafix_build import BuildError
    from patch_tree import BASE_TAG, git, materialise
    from pr_bundles import export_prs

    python = os.path.abspath(pristine_python(args.pristine_python, args.fork_python))
    info = describe_python(python)
    if info["deepspeed"] != pin.version:
        raise SetupError(f"--pristine-python {python} has deepspeed {info['deepspeed']}, not pristine "
                         f"{pin.version} (upstream.json): the prefixes are laid over it")
    tree = work_dir / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    try:
        bundles = export_prs(work_dir / "prs")
        materialise(tree)
    except BuildError as err:
        raise SetupError(f"the PR bundles or the pristine tree could not be made: {err}") from err
    git(tree, "checkout", "-q", "--detach", BASE_TAG)
    return python, info, tree, bundles


def report_prefixes(rows, report_md):
    """The prefixes table into ``report_md`` and a summary line; the exit status (1 unless every patch passed)."""
    table = prefixes.as_markdown(rows)
    report_md.parent.mkdir(parents=True, exist_ok=True)
    report_md.write_text(table + "\n")
    print(table)
    unrun = [prefix.number for prefix, mine, ok in rows if not ok and prefixes.every_case_skipped(mine)]
    failing = [prefix.number for prefix, _, ok in rows if not ok and prefix.number not in unrun]
    print(f"{len(rows) - len(failing) - len(unrun)} of {len(rows)} patches pass their own test with only the bundles "
          f"up to them applied{'; failing: ' + ', '.join(failing) if failing else ''}"
          f"{'; not run here (every case skipped): ' + ', '.join(unrun) if unrun else ''}; table: {report_md}")
    return 1 if failing or unrun or not rows else 0


def main(argv=None):
    args = parse_args(argv)
    try:
        return run(args)
    except (SetupError, baseline.BaselineError, OutcomeMismatch, work_dir_lock.WorkDirBusy) as err:
        print(f"run-upstream-suite: error: {err}", file=sys.stderr)
        return 2
