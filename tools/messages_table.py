#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What the fork answers to a user's mistakes: each mistake of docs/reference/mistakes.toml run as the user runs
it (``ds_gas_check --config ds_config.json ...``, or ``deepspeed.initialize`` in a training script), its exit status
and message; ``--write`` puts the table into docs/reference/messages.md (``--json``: every line printed).

    tools/messages_table.py              print the table, and each mistake whose answer misses its "says" or "exit"
    tools/messages_table.py --write      rewrite docs/reference/messages.md's table
    tools/messages_table.py --json F     also write every answer, whole, to F
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from toolkit import REPO, tables
from toolkit.ports import free_port

MISTAKES = REPO / "docs" / "reference" / "mistakes.toml"
PAGE = REPO / "docs" / "reference" / "messages.md"
BEGIN, END = "<!-- messages: begin -->", "<!-- messages: end -->"

# A training script as a user writes one, on 1 rank: the mistake's config given to deepspeed.initialize.
TRAINING_SCRIPT = """\
import sys
import torch
import deepspeed
model = torch.nn.Linear(8, 4)
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=sys.argv[1])
print(f"trained with gradient_accumulation_steps {engine.gradient_accumulation_steps()}, "
      f"ZeRO stage {engine.zero_optimization_stage()}")
"""
TIMEOUT = 300


def load(path=MISTAKES):
    return tomllib.loads(path.read_text())["mistake"]


def run(mistake, python=sys.executable, timeout=TIMEOUT, env=None):
    """(exit status, output lines) of ``mistake``, run in a directory of its own (``env``: added to this process's
    environment)."""
    with tempfile.TemporaryDirectory() as work:
        Path(work, "ds_config.json").write_text(mistake["config"])
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        if mistake.get("engine"):
            Path(work, "train.py").write_text(TRAINING_SCRIPT)
            env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
            cmd = [python, "train.py", "ds_config.json"]
        else:
            cmd = [python, "-m", "deepspeed.gafix.gas_check", "--config", "ds_config.json", *mistake.get("args", [])]
        done = subprocess.run(cmd,
                              cwd=work,
                              env=env,
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT,
                              text=True,
                              timeout=timeout)
    return done.returncode, done.stdout.splitlines()


LOG_PREFIX = re.compile(r"^(\[rank\d+\]: )?(\[\d{4}-[^\]]*\] \[\w+\] \[[^\]]*\] )?")


def run_all(python=sys.executable, env=None):
    """[(mistake, (exit status, output lines))] for every mistake, two at a time."""
    mistakes = load()
    with ThreadPoolExecutor(2) as pool:
        return list(zip(mistakes, pool.map(lambda mistake: run(mistake, python, env=env), mistakes)))


def message(lines, says):
    """The lines a user reads for the answer: those holding what it must say, else the last; a logger's time and
    place left out."""
    lines = [LOG_PREFIX.sub("", line) for line in lines]
    # A traceback's frames name files by where the package is installed: not what the user reads for the answer.
    told = [line for line in lines if not line.lstrip().startswith('File "')]
    return [line for line in told if any(text in line for text in says)] or told[-1:]


def problems(mistake, status, lines):
    """What the answer to ``mistake`` misses: its exit status, or a text it must hold."""
    found = []
    if status != mistake["exit"]:
        found.append(f"exit {status}, not {mistake['exit']}")
    text = "\n".join(lines)
    found += [f"does not say {says!r}" for says in mistake["says"] if says not in text]
    return found


def table(answers):
    rows = []
    for mistake, (status, lines) in answers:
        where = "deepspeed.initialize" if mistake.get("engine") else "ds_gas_check " + " ".join(mistake.get(
            "args", []))
        shown = " ".join(f"`{line.strip()}`" for line in message(lines, mistake["says"]))
        rows.append([mistake["what"], where.strip(), status, shown])
    return tables.table(["mistake", "run by", "exit", "what it says"], rows, right=("exit", ))


def page_with(lines, page):
    head, rest = page.split(BEGIN, 1)
    return head + BEGIN + "\n" + "\n".join(lines) + "\n" + END + rest.split(END, 1)[1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite docs/reference/messages.md's table")
    parser.add_argument("--json", help="write every answer, whole, to this file")
    parser.add_argument("--python", default=sys.executable, help="interpreter with the deepspeed to ask")
    args = parser.parse_args(argv)
    answers = run_all(args.python)
    lines = table(answers)
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(
            json.dumps([dict(m, status=s, output=out) for m, (s, out) in answers], indent=1) + "\n")
    if args.write:
        PAGE.write_text(page_with(lines, PAGE.read_text()))
    missed = [(m["what"], p) for m, (s, out) in answers for p in problems(m, s, out)]
    for what, problem in missed:
        print(f"{what}: {problem}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
