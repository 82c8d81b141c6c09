# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The engine's config surface: every key DeepSpeed reads, read off the installed engine, not listed by hand.

- every key ``DeepSpeedConfig`` reads while it parses a config (a dict that records each lookup, at the top
  level and one level into each section);
- every field of the pydantic config models under those keys (``DeepSpeedConfigModel`` subclasses, their
  nested models walked), by the name a user writes (the field's alias where it has one).

``ds_gas_check``'s pre-flight names a config key outside it; the fork's coverage map gives each key a row
(``coverage_map()``: docs/reference/engine_surface.toml, shipped beside this module as engine_surface.json).
"""

import contextlib
import json
from pathlib import Path
from unittest import mock

MAP_FILE = Path(__file__).with_name("engine_surface.json")

# The pydantic model each section's value is parsed into (the rest of a section is read key by key).
# Every training-side DeepSpeedConfigModel must be reachable from here: a new one fails the coverage map's check.
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


@contextlib.contextmanager
def parsing_as_rank_0_of(size):
    """deepspeed.comm as on rank 0 of ``size`` ranks, so that DeepSpeedConfig parses before any rank starts."""
    with mock.patch("deepspeed.comm.is_initialized", return_value=True), \
            mock.patch("deepspeed.comm.get_world_size", return_value=size), \
            mock.patch("deepspeed.comm.get_rank", return_value=0):
        yield


def _keys_read(sections=()):
    """The keys ``DeepSpeedConfig`` reads from a config holding only a batch size and ``sections``, each an
    empty dict (so their own keys are looked up too); parsed as on rank 0 of 2, so that the data-parallel
    size's keys are read as well."""
    from deepspeed.runtime.config import DeepSpeedConfig
    seen = set()
    config = _RecordingDict("", seen, {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1})
    for section in sections:
        dict.__setitem__(config, section, _RecordingDict(section + ".", seen))
    with parsing_as_rank_0_of(2):
        parsed = DeepSpeedConfig(config)
    # The parser looks the top-level keys up in a copy of its own, which records them (the unknown-keys warning).
    return seen | set(getattr(parsed, "_keys_looked_up", ()))


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


def config_keys(section_models=None, reached=None):
    """Every config key of the engine's surface, sorted; ``reached`` (a set) collects the config models the
    sections of ``section_models`` (default ``SECTION_MODELS``: section -> model or its dotted name) reach."""
    section_models = SECTION_MODELS if section_models is None else section_models
    reached = set() if reached is None else reached
    top = _keys_read()
    keys = set(top)
    for section in sorted(k for k in top if "." not in k):
        try:
            keys |= _keys_read([section])
        except Exception:  # the parser takes this key for a scalar (or a list): it has no keys of its own
            pass
    for section, model in section_models.items():
        keys.add(section)
        keys |= _model_keys(section, _import(model) if isinstance(model, str) else model, reached)
    return sorted(keys)


def surface(section_models=None):
    """(keys, unmapped): every config key of the engine's surface, and the engine's training-side config
    models that no section of ``section_models`` reaches."""
    reached = set()
    keys = config_keys(section_models, reached)
    return keys, sorted(_unmapped_models(reached))


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


def coverage_map():
    """The coverage map's rows: ``keys``, ``status``, ``note``, ``tests`` (tools/engine_surface.py writes the file)."""
    return json.loads(MAP_FILE.read_text())["rows"]


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
