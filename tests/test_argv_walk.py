# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""tools/argv_walk.py counts what it claims: a call with the value among its parameters is a stop, once per function;
a function returning it, alone or in a tuple, is a return; a function receiving it inside an object is a carrier, not
a stop; functions outside the root, and values equal in another type, are not counted."""

import importlib.util
import sys
import textwrap
from argparse import Namespace

import argv_walk

TOY = textwrap.dedent("""
    from argparse import Namespace
    from dataclasses import dataclass

    @dataclass
    class Options:
        steps: int
        name: str

    def parse(argv):
        return Namespace(steps=int(argv[1]), other=2)

    def split(args):
        return args.steps, args.other

    def prepare(steps, other):
        return Options(steps=steps, name="x")

    def count(steps):
        return steps

    def unrelated(value):
        return [value]

    def run(options, config):
        unrelated(options.name)
        unrelated(3)
        return count(options.steps)

    def main(argv):
        options = prepare(*split(parse(argv)))
        for _ in range(3):
            run(options, {})
        run(options, "11")
        return 0
""")


def load_toy(tmp_path):
    path = tmp_path / "toy.py"
    path.write_text(TOY)
    spec = importlib.util.spec_from_file_location("argv_walk_toy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def walked(root, toy):
    walk = argv_walk.Walk(root, 11)
    sys.settrace(walk.trace)
    try:
        toy.main(["--steps", "11"])
    finally:
        sys.settrace(None)
    return walk


def names(functions):
    return sorted(name for _, name, _ in functions)


def test_stops_files_returns_and_carriers_of_a_value_followed_from_argv(tmp_path):
    walk = walked(tmp_path, load_toy(tmp_path))
    # main and parse get "11", a str; unrelated gets "x" and 3.
    assert names(walk.stops) == ["count", "prepare"]
    assert names(walk.returns) == ["count", "run", "split"]  # parse and prepare return it inside an object
    assert names(walk.carriers) == ["run", "split"]
    assert walk.stops[next(where for where in walk.stops if where[1] == "count")] == 4
    assert walk.summary() == {"stops": 2, "files": 1, "returns": 3, "carriers": 2}


def test_nothing_outside_the_root_is_counted(tmp_path):
    (tmp_path / "inside").mkdir()
    walk = walked(tmp_path / "inside", load_toy(tmp_path))
    assert walk.summary() == {"stops": 0, "files": 0, "returns": 0, "carriers": 0}


def test_what_holds_the_value():
    assert argv_walk.holds(11, 11) and not argv_walk.holds("11", 11) and not argv_walk.holds(11.0, 11)
    assert argv_walk.holds(Namespace(steps=11), 11) and argv_walk.holds({"a": [11]}, 11)
    assert not argv_walk.holds({"a": {"b": [11]}}, 11)  # three levels down
