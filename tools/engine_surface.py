#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The engine's config surface and the coverage map over it.

The surface is read off the installed engine, not listed by hand:

- every key ``DeepSpeedConfig`` reads while it parses a config (a dict that records each lookup, at the top
  level and one level into each section);
- every field of the pydantic config models under those keys (``DeepSpeedConfigModel`` subclasses, their
  nested models walked), by the name a user writes (the field's alias where it has one).

The map (``docs/reference/engine_surface.toml``) gives each key a row: how the fork's promise stands on it
(``STATUSES``). ``check()`` fails on a key with no row (a rebase that adds one), on a row no key matches
(a key that went away), and on a row without what its status needs; ``render()`` writes the table of
``docs/reference/engine_surface.md``.

    tools/engine_surface.py            print what check() finds (exit 1 if anything)
    tools/engine_surface.py --write    rewrite docs/reference/engine_surface.md from the map
    tools/engine_surface.py --keys     print the surface, one key a line
"""

import argparse
import sys
import tomllib
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
MAP = REPO / "docs" / "reference" / "engine_surface.toml"
PAGE = REPO / "docs" / "reference" / "engine_surface.md"

# status -> (what it means, what a row of it must name)
STATUSES = {
    "covered": ("fork against fp64 PyTorch at several GAS splits and world sizes", "tests"),
    "refused": ("the engine refuses it with an error naming the key", "note"),
    "approximate": ("approximate by design; the invariance it does promise is tested", "note"),
    "removed": ("0.19.8 itself refuses the key", "note"),
    "gpu-only": ("runs on a GPU only; checked by tools/gpu-check", "note"),
    "open": ("on the gradient path, not yet checked against fp64", "note"),
    "off-path": ("does not touch gradient accumulation, reduction, scaling, overflow or clipping", "note"),
}

# The pydantic model each section's value is parsed into (the rest of a section is read key by key).
# Every training-side DeepSpeedConfigModel must be reachable from here: a new one fails check().
SECTION_MODELS = {
    "zero_optimization": "deepspeed.runtime.zero.config.DeepSpeedZeroConfig",
    "bf16": "deepspeed.runtime.precision_config.DeepSpeedBF16Config",
    "fp16": "deepspeed.runtime.precision_config.DeepSpeedFP16Config",
    "compile": "deepspeed.compile.config.CompileConfig",
    "tensor_parallel": "deepspeed.runtime.tensor_parallel.config.TPTrainingConfig",
    "comms_logger": "deepspeed.comm.config.CommsLoggerConfig",
    "tensorboard": "deepspeed.monitor.config.TensorBoardConfig",
    "wandb": "deepspeed.monitor.config.WandbConfig",
    "csv_monitor": "deepspeed.monitor.config.CSVConfig",
    "comet": "deepspeed.monitor.config.CometConfig",
    "timers.throughput": "deepspeed.utils.config.DeepSpeedThroughputTimerConfig",
    "hybrid_engine": "deepspeed.runtime.config.HybridEngineConfig",
}
# Modules whose config models belong to inference or to a container of the others, not to a training section.
NOT_SECTIONS = ("deepspeed.inference", "deepspeed.monitor.config.DeepSpeedMonitorConfig")


class _RecordingDict(dict):
    """A config dict that records every key looked up in it, as ``prefix + key``."""

    def __init__(self, prefix, seen, *args):
        super().__init__(*args)
        self.prefix, self.seen = prefix, seen

    def _record(self, key):
        if isinstance(key, str):
            self.seen.add(self.prefix + key)

    def __getitem__(self, key):
        self._record(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._record(key)
        return super().get(key, default)

    def __contains__(self, key):
        self._record(key)
        return super().__contains__(key)

    def __copy__(self):
        return _RecordingDict(self.prefix, self.seen, dict(self))

    def keys(self):
        outer = self

        class _Keys:  # ``KEY in config.keys()``, as several of the parser's helpers test

            def __contains__(self, key):
                outer._record(key)
                return dict.__contains__(outer, key)

            def __iter__(self):
                return iter(list(dict.keys(outer)))

            def __len__(self):
                return dict.__len__(outer)

        return _Keys()


def _keys_read(sections=()):
    """The keys ``DeepSpeedConfig`` reads from a config holding only a batch size and ``sections``, each an
    empty dict (so their own keys are looked up too); parsed as on rank 0 of 2, so that the data-parallel
    size's keys are read as well."""
    from deepspeed.runtime.config import DeepSpeedConfig
    seen = set()
    config = _RecordingDict("", seen, {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1})
    for section in sections:
        dict.__setitem__(config, section, _RecordingDict(section + ".", seen))
    with mock.patch("deepspeed.comm.is_initialized", return_value=True), \
            mock.patch("deepspeed.comm.get_world_size", return_value=2), \
            mock.patch("deepspeed.comm.get_rank", return_value=0):
        DeepSpeedConfig(config)
    return seen


def _import(dotted):
    module, name = dotted.rsplit(".", 1)
    return getattr(__import__(module, fromlist=[name]), name)


def _model_keys(prefix, model, reached):
    """``prefix.<name>`` of every field of ``model`` and of the models nested in it."""
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel
    reached.update(base for base in model.__mro__ if isinstance(base, type) and issubclass(base, DeepSpeedConfigModel))
    keys = set()
    for name, field in model.model_fields.items():
        key = f"{prefix}.{field.alias or name}"
        keys.add(key)
        nested = [
            t for t in (field.annotation, *getattr(field.annotation, "__args__", ()))
            if isinstance(t, type) and issubclass(t, DeepSpeedConfigModel)
        ]
        for sub in nested:
            keys |= _model_keys(key, sub, reached)
    return keys


def surface(section_models=None):
    """(keys, unmapped): every config key of the engine's surface, and the engine's training-side config
    models that no section of ``section_models`` (default ``SECTION_MODELS``: section -> model or its dotted
    name) reaches."""
    section_models = SECTION_MODELS if section_models is None else section_models
    top = _keys_read()
    keys = set(top)
    for section in sorted(k for k in top if "." not in k):
        try:
            keys |= _keys_read([section])
        except Exception:  # the parser takes this key for a scalar (or a list): it has no keys of its own
            pass
    reached = set()
    for section, model in section_models.items():
        keys.add(section)
        keys |= _model_keys(section, _import(model) if isinstance(model, str) else model, reached)
    return sorted(keys), sorted(_unmapped_models(reached))


def _unmapped_models(reached):
    import importlib
    import pkgutil

    from deepspeed.runtime.config_utils import DeepSpeedConfigModel
    for package in ("runtime", "compile", "comm", "monitor", "utils"):
        root = importlib.import_module(f"deepspeed.{package}")
        for info in pkgutil.walk_packages(root.__path__, f"deepspeed.{package}."):
            if info.name.endswith("config") or ".config" in info.name:
                try:
                    importlib.import_module(info.name)
                except Exception:  # an optional dependency missing: its models cannot be in use either
                    continue

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    for model in set(subclasses(DeepSpeedConfigModel)) - reached:
        dotted = f"{model.__module__}.{model.__name__}"
        if dotted.startswith("deepspeed.") and not dotted.startswith(NOT_SECTIONS):
            yield dotted


def load_map(path=MAP):
    with open(path, "rb") as f:
        return tomllib.load(f)["row"]


def matches(pattern, key):
    """A row's key: exact, or ``section.*`` for every key under ``section`` (a row naming a key exactly
    takes it from a ``section.*`` row)."""
    if pattern.endswith(".*"):
        return key.startswith(pattern[:-1])
    return key == pattern


def rows_of(key, rows):
    """The rows that hold ``key``: those naming it exactly, else those whose ``section.*`` covers it."""
    exact = [row for row in rows if key in row["keys"]]
    return exact or [row for row in rows if any(matches(pattern, key) for pattern in row["keys"])]


def problems(keys, rows, unmapped=(), repo=REPO):
    """Everything wrong with ``rows`` as a map of ``keys``: one line each."""
    found = []
    for key in keys:
        holding = rows_of(key, rows)
        if not holding:
            found.append(f"{key}: no row in {MAP.relative_to(REPO)} (what does the fork promise on it?)")
        elif len({row["status"] for row in holding}) > 1:
            found.append(f"{key}: rows of different statuses: {sorted({row['status'] for row in holding})}")
    for row in rows:
        for pattern in row["keys"]:
            if not any(matches(pattern, key) for key in keys):
                found.append(f"{pattern}: a row, but the engine reads no such key")
        status = row.get("status")
        if status not in STATUSES:
            found.append(f"{row['keys']}: status {status!r} is none of {sorted(STATUSES)}")
            continue
        needs = STATUSES[status][1]
        if not row.get(needs):
            found.append(f"{row['keys']}: a {status!r} row needs its {needs!r}")
        for test in row.get("tests", []):
            if not (repo / test.split("::")[0]).is_file():
                found.append(f"{row['keys']}: test {test} does not exist")
    for model in unmapped:
        found.append(f"{model}: a config model no section of SECTION_MODELS reaches (tools/engine_surface.py)")
    return found


def render(rows, keys):
    """The markdown tables of the map, by status, each headed by how many of the engine's ``keys`` it holds."""
    status_of_keys = [holding[0]["status"] for holding in (rows_of(key, rows) for key in keys) if holding]
    lines = []
    for status, (meaning, _) in STATUSES.items():
        of_status = [row for row in rows if row["status"] == status]
        if not of_status:
            continue
        count = status_of_keys.count(status)
        lines += [f"### {status} ({count} keys)", "", meaning + ".", "", "| keys | what | tests |", "|---|---|---|"]
        for row in of_status:
            names = ", ".join(f"`{k}`" for k in row["keys"])
            tests = ", ".join(f"`{t}`" for t in row.get("tests", []))
            lines.append(f"| {names} | {row.get('note', '')} | {tests} |")
        lines.append("")
    return "\n".join(lines)


BEGIN, END = "<!-- engine-surface: begin -->", "<!-- engine-surface: end -->"


def page_with(rows, keys, page_text):
    """``page_text`` with its generated part replaced by ``render(rows, keys)``."""
    head, rest = page_text.split(BEGIN, 1)
    return head + BEGIN + "\n" + render(rows, keys) + END + rest.split(END, 1)[1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite the page's tables from the map")
    parser.add_argument("--keys", action="store_true", help="print the engine's config surface")
    args = parser.parse_args(argv)
    keys, unmapped = surface()
    if args.keys:
        print("\n".join(keys))
        return 0
    rows = load_map()
    if args.write:
        PAGE.write_text(page_with(rows, keys, PAGE.read_text()))
        return 0
    found = problems(keys, rows, unmapped)
    if PAGE.read_text() != page_with(rows, keys, PAGE.read_text()):
        found.append(f"{PAGE.relative_to(REPO)} is not what the map renders: tools/engine_surface.py --write")
    print("\n".join(found) or f"{len(keys)} keys, every one with a row")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
