#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""How far one ds_gas_check option travels: its value followed from argv through the checker's functions.

The check runs on one rank, in this process, under a trace of the checker's functions (the installed
deepspeed/gafix). A stop is a call whose parameters include the value itself: the option unpacked and handed on by
name. A return is a function returning it, alone or in a tuple. Counted once per function. Where the option travels
inside one object (the parsed options, a request, the check's options) the functions that receive the object are
counted apart, as carriers, not as stops:

    tools/argv_walk.py --value 11 -- --config ds_config.json --steps 11

Pick a value nothing else in the run equals (the count compares by value and type).
"""

import argparse
import sys
from collections import Counter
from pathlib import Path

CONTAINERS = (list, tuple, set, frozenset)


def holds(obj, value, depth=2):
    """Whether ``obj`` is ``value``, or holds it ``depth`` attributes, keys or items down."""
    if type(obj) is type(value) and obj == value:
        return True
    if depth == 0:
        return False
    if isinstance(obj, dict):
        members = list(obj.values())
    elif isinstance(obj, CONTAINERS):
        members = list(obj)[:64]
    elif hasattr(obj, "__dict__") and not isinstance(obj, type) and type(obj).__module__ != "builtins":
        if type(obj).__module__.startswith("torch"):
            return False
        members = list(vars(obj).values())
    else:
        return False
    return any(holds(member, value, depth - 1) for member in members)


class Walk:
    """The trace of the functions under ``root``: stops, returns and carriers, by function."""

    def __init__(self, root, value):
        self.root, self.value = str(root), value
        self.stops, self.returns, self.carriers = Counter(), Counter(), Counter()

    def is_value(self, obj):
        return type(obj) is type(self.value) and obj == self.value

    def trace(self, frame, event, arg):
        if event != "call" or not frame.f_code.co_filename.startswith(self.root):
            return None
        where = (frame.f_code.co_filename, frame.f_code.co_name, frame.f_code.co_firstlineno)
        parameters = list(dict(frame.f_locals).values())
        if any(self.is_value(parameter) for parameter in parameters):
            self.stops[where] += 1
        elif any(holds(parameter, self.value) for parameter in parameters):
            self.carriers[where] += 1

        def on_return(frame, event, arg):
            if event == "return" and (self.is_value(arg) or
                                      (isinstance(arg, tuple) and any(self.is_value(item) for item in arg))):
                self.returns[where] += 1
            return on_return

        return on_return

    def summary(self):
        return {
            "stops": len(self.stops),
            "files": len({where[0]
                          for where in self.stops}),
            "returns": len(self.returns),
            "carriers": len(self.carriers)
        }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--value", required=True, help="the option's value, as the command line gives it")
    parser.add_argument("--list", action="store_true", help="also list the functions")
    parser.add_argument("check_args", nargs=argparse.REMAINDER, help="-- then ds_gas_check's arguments")
    args = parser.parse_args(argv)
    check_args = args.check_args[1:] if args.check_args[:1] == ["--"] else args.check_args
    value = int(args.value) if args.value.lstrip("-").isdigit() else args.value
    import deepspeed.gafix
    from deepspeed.gafix.gas_check import cli
    walk = Walk(Path(deepspeed.gafix.__file__).parent, value)
    sys.settrace(walk.trace)
    try:
        status = cli.main(check_args)
    finally:
        sys.settrace(None)
    summary = walk.summary()
    if args.list:
        root = Path(deepspeed.gafix.__file__).parent
        for kind, functions in (("stop", walk.stops), ("carrier", walk.carriers), ("return", walk.returns)):
            for path, name, line in sorted(functions):
                print(f"  {kind}: {Path(path).relative_to(root)}:{line} {name}")
    print(f"argv-walk: {summary['stops']} stops in {summary['files']} files, {summary['returns']} returns; "
          f"{summary['carriers']} functions receive it inside an object (ds_gas_check exit {status})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
