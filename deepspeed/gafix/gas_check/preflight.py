# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The pre-flight: what ``deepspeed.initialize`` would refuse, refused before any rank starts, with the engine's own
reason; every key the engine does not read, named with the nearest one it does.

Run by ``ds_gas_check`` before it launches (``--preflight``: only this). A refusal is bad input (exit status 2,
one line each); an unknown key with a near known one is taken for a misspelling and refused too (DeepSpeed
ignores it, so the check would test another config than the one meant); an unknown key with none near is a note.
"""

import copy
import difflib
import functools
from dataclasses import dataclass, field

from .config_rules import BATCH_KEYS

# Sections whose keys are free (an optimizer's or scheduler's own arguments): not checked below them.
FREE = ("optimizer.params", "scheduler.params")
SIMILAR = 0.75  # difflib's ratio from which an unknown key is taken for a misspelling of a known one

# Statuses of the coverage map (docs/reference/engine_surface.md) a user is told of on every run, not only with
# --preflight: the config takes a path whose numbers the fork has not checked, or checks only on a GPU.
TOLD_ALWAYS = ("open", "approximate", "gpu-only")


@dataclass
class Preflight:
    errors: list = field(default_factory=list)  # one line each: exit status 2
    notes: list = field(default_factory=list)
    coverage: list = field(default_factory=list)  # (status, the config's keys, what the map says), one per row


def unknown_keys(config, known, prefix=""):
    """``[(dotted key, nearest known key or None)]`` for every key of ``config`` the engine does not read, at any
    depth (below a known key only where the engine reads keys under it)."""
    found = []
    children = sorted({key[len(prefix):].split(".", 1)[0] for key in known if key.startswith(prefix)})
    if not children:  # a key whose value the engine takes whole
        return found
    for key, value in config.items():
        path = prefix + str(key)
        if path in FREE:
            continue
        if key in children:
            if isinstance(value, dict):
                found += unknown_keys(value, known, path + ".")
            continue
        near = difflib.get_close_matches(str(key), children, n=1, cutoff=SIMILAR)
        found.append((path, prefix + near[0] if near else None))
    return found


def auto_values(config, prefix=""):
    """Dotted keys whose value is "auto": a Hugging Face Trainer or accelerate fills them from its own arguments."""
    found = []
    for key, value in config.items():
        if isinstance(value, dict):
            found += auto_values(value, prefix + f"{key}.")
        elif value == "auto":
            found.append(prefix + str(key))
    return found


def set_keys(config, prefix=""):
    """Every dotted key ``config`` sets, sections included, below free sections not."""
    found = []
    for key, value in config.items():
        path = prefix + str(key)
        found.append(path)
        if isinstance(value, dict) and path not in FREE:
            found += set_keys(value, path + ".")
    return found


def coverage(config, rows=None):
    """``[(status, [the config's keys], note)]``: the coverage map's row of each key ``config`` sets, in the map's
    order (``rows``: default, the map shipped with the fork)."""
    from deepspeed.gafix.config_surface import coverage_map, rows_of
    rows = coverage_map() if rows is None else rows
    held = {}
    for key in set_keys(config):
        for row in rows_of(key, rows):
            held.setdefault(id(row), []).append(key)
    return [(row["status"], held[id(row)], row.get("note", "")) for row in rows if id(row) in held]


def engine_refusal(config, world, unknown=()):
    """The engine's reason for refusing ``config`` on ``world`` data-parallel ranks, in one line; None if it
    parses. What ``DeepSpeedConfig`` checks, the config models included; not what the engine finds later (the
    optimizer's construction, the model). A config model's refusal is told by the user's dotted key, leaving out
    the keys in ``unknown`` (already named)."""
    from deepspeed.gafix.config_surface import SECTION_MODELS, parsing_as_rank_0_of
    from deepspeed.runtime.config import DeepSpeedConfig
    from .config_rules import pydantic_refusals
    try:
        with parsing_as_rank_0_of(world):
            DeepSpeedConfig(copy.deepcopy(dict(config, unknown_keys="ignore")))  # the pre-flight names them itself
    except Exception as err:  # the engine's own refusal, whatever its type (assert, ValueError, pydantic's)
        lines = pydantic_refusals(err, SECTION_MODELS, set(unknown))
        if lines is None:
            return one_line(err)
        return "; ".join(lines) or None
    return None


def one_line(err):
    """An exception as one line: pydantic's multi-line report folded, a bare assert named by its type."""
    text = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    text = text.split(" For further information visit", 1)[0]
    return text or type(err).__name__


def engine_paths(config):
    """The engine paths ``config`` selects, in words."""
    zero = config.get("zero_optimization") or {}
    dtype = ("bf16" if (config.get("bf16") or {}).get("enabled") else "fp16" if
             (config.get("fp16") or {}).get("enabled") else "fp32")
    parts = [f"ZeRO {zero.get('stage', 0)}", dtype, f"optimizer {(config.get('optimizer') or {}).get('type', 'SGD')}"]
    for what in ("offload_optimizer", "offload_param"):
        device = (zero.get(what) or {}).get("device", "none")
        if device != "none":
            parts.append(f"{what} to {device}")
    if zero.get("stage", 0) in (2, 3) and zero.get("reduce_scatter") is False:
        parts.append("reduce_scatter off")
    # Unset, the engine clips at its default (1.0 since 0.19.3), as the check's run does: say that, not 0.
    from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT
    clip = config.get("gradient_clipping")
    parts.append(f"gradient_clipping {GRADIENT_CLIPPING_DEFAULT} (the default)" if clip is
                 None else f"gradient_clipping {clip}")
    parts.append(f"loss_normalization {config.get('loss_normalization', 'mean')}")
    return ", ".join(parts)


@functools.cache
def known_keys():
    """The installed engine's config keys (about a second to read off it: once per process)."""
    from deepspeed.gafix.config_surface import config_keys
    return frozenset(config_keys())


def preflight(config, splits, world, pipeline_stages=0, known=None):
    """Check ``config`` (as ``ds_gas_check`` trains it: each split's batch keys in place of its own) on ``world``
    ranks. ``known``: the engine's config keys (default: read off the installed engine)."""
    from .training import split_config
    result = Preflight()
    known = known_keys() if known is None else set(known)
    unknown = unknown_keys(config, known)
    for key, near in unknown:
        if near:
            result.errors.append(f"{key}: unknown; did you mean {near}? (DeepSpeed ignores a key it does not know, "
                                 "so the check would test another config)")
        elif config.get("unknown_keys") == "error":
            result.errors.append(f"{key}: not a key DeepSpeed reads (the config's \"unknown_keys\": \"error\" "
                                 "refuses it)")
        else:
            result.notes.append(f"{key}: not a key DeepSpeed reads; ignored")
    autos = auto_values(config)
    if autos:
        result.errors.append(f"{', '.join(autos)}: \"auto\" is filled in by the Hugging Face Trainer or accelerate "
                             "from their own arguments; give ds_gas_check the values they would set")
        return result
    result.coverage = coverage(config)
    if (config.get("compile") or {}).get("deepcompile"):
        # The engine accepts the key anywhere, and compile() fails only when it builds DeepCompile's CUDA op.
        from deepspeed.accelerator import get_accelerator
        device = get_accelerator().device_name()
        if device != "cuda":
            result.errors.append(f"compile.deepcompile: DeepCompile runs on CUDA devices only (this accelerator: "
                                 f"{device}); check this config on a GPU")
    dp_world = world // (pipeline_stages or 1)
    from deepspeed.accelerator import get_accelerator
    from .config_rules import refusals
    sections = sorted({key.split(".", 1)[0] for key in known if "." in key})
    own_rules = refusals(config, dp_world, sections, get_accelerator().device_name())
    if own_rules:
        # Each names the user's key and what would work; the engine's refusal of the same would not.
        result.errors += own_rules
        return result
    micro, gas = splits[0]
    named = [key for key, _ in unknown]
    refusal = engine_refusal(split_config(config, micro, gas), dp_world, named)
    given = [key for key in BATCH_KEYS if key in config]
    if given:
        # The batch keys are to blame only when the config with a split's in their place is accepted.
        own = engine_refusal(config, dp_world, named)
        if own and own != refusal:
            result.errors.append(f"the engine refuses this config's batch keys on {dp_world} data-parallel rank(s): "
                                 f"{own}")
        result.notes.append(f"{', '.join(given)}: replaced by each split's (--splits) while the check runs")
    if refusal:
        result.errors.append(f"the engine refuses this config: {refusal}")
    return result
