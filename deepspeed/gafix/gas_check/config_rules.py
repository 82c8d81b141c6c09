# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What a config must hold before the engine is given it, each refusal in the user's terms: the key as written, its
value, the rule, and values that would work.

The engine refuses most of these itself, but in its own terms ("Train batch size: 0 has to be greater than 0" for a
GAS of 0), with a traceback (an optimizer it does not know) or not at all (a negative clip norm turns clipping off).
"""

import difflib
import json
import re

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
# What DeepSpeed's own optimizers are called in a config (the engine takes any torch.optim class too).
DEEPSPEED_OPTIMIZERS = ("Adam", "AdamW", "Adagrad", "Lamb", "Lion", "Muon", "MuAdam", "MuAdamW", "MuSGD")
# Optimizer arguments that are numbers (or lists of numbers) for every optimizer that takes them.
NUMERIC_PARAMS = ("lr", "betas", "eps", "weight_decay", "momentum", "dampening", "alpha", "lr_decay")
# An example of each section a user may have written as a bare value.
SECTION_EXAMPLES = {
    "zero_optimization": '{{"stage": {value}}}',
    "bf16": '{{"enabled": {value}}}',
    "fp16": '{{"enabled": {value}}}',
    "checkpoint": '{"reshard_on_load": true}',
}


def shown(value):
    """A value as the user wrote it in JSON."""
    return json.dumps(value)


def _whole_number(value):
    return isinstance(value, int) and not isinstance(value, bool)


def batch_refusals(config, dp_world):
    """Refusals of the config's own batch keys on ``dp_world`` data-parallel ranks, each naming the keys, their values
    and the values that would work."""
    given = {key: config[key] for key in BATCH_KEYS if key in config}
    bad = [
        f"{key}: {shown(value)}: a batch size or step count is a whole number of at least 1" +
        (f" (written as a string: {value.strip()} without quotes)" if isinstance(value, str) else "")
        for key, value in given.items() if not _whole_number(value) or value < 1
    ]
    if bad:
        return bad
    total, micro, gas = (given.get(key) for key in BATCH_KEYS)
    if total is None:  # the rest follows from the ranks (or, without any, from the check's splits)
        return []
    ranks = f"{dp_world} data-parallel rank(s)"
    if micro is not None and gas is not None:
        if total == micro * gas * dp_world:
            return []
        works = [f'"train_batch_size": {micro * gas * dp_world}', "train_batch_size left out (DeepSpeed computes it)"]
        if total % (micro * dp_world) == 0:
            works.append(f'"gradient_accumulation_steps": {total // (micro * dp_world)}')
        if total % (gas * dp_world) == 0:
            works.append(f'"train_micro_batch_size_per_gpu": {total // (gas * dp_world)}')
        return [
            f"train_batch_size {total} is not train_micro_batch_size_per_gpu {micro} x gradient_accumulation_steps "
            f"{gas} x {ranks} = {micro * gas * dp_world}; would work: {', or '.join(works)}"
        ]
    per_step = (micro or 1) * (gas or 1) * dp_world  # what train_batch_size must be a multiple of
    if total % per_step == 0:
        return []
    held = " x ".join([f"train_micro_batch_size_per_gpu {micro}"] * (micro is not None) +
                      [f"gradient_accumulation_steps {gas}"] * (gas is not None) + [ranks])
    lower, upper = total // per_step * per_step, (total // per_step + 1) * per_step
    works = [f'"train_batch_size": {n}' for n in (lower, upper) if n >= 1]
    return [
        f"train_batch_size {total} does not divide into {held} (a multiple of {per_step}); would work: "
        f"{' or '.join(works)}"
    ]


def section_refusals(config, sections):
    """A section (a key with keys of its own) written as a bare value."""
    found = []
    for key in sections:
        value = config.get(key)
        if key in config and value is not None and not isinstance(value, dict):
            example = SECTION_EXAMPLES.get(key, "{...}").format(value=shown(value))
            found.append(f"{key}: {shown(value)}: a section, written as an object of its own keys, e.g. "
                         f"\"{key}\": {example}")
    return found


def precision_refusals(config, device):
    bf16 = bool((config.get("bf16") or config.get("bfloat16") or {}).get("enabled"))
    fp16 = bool((config.get("fp16") or {}).get("enabled"))
    if bf16 and fp16:
        return [
            "bf16.enabled and fp16.enabled: both true; a run trains in one 16-bit type, not both: set the other's "
            "\"enabled\" to false"
        ]
    if fp16 and device == "cpu":
        return [
            "fp16.enabled: fp16 (with its loss scale) is a GPU path; this machine trains on its CPU: check the "
            "config on the GPU it trains on, or check it here with \"bf16\": {\"enabled\": true} in its place"
        ]
    return []


def optimizer_refusals(config):
    import torch
    found = []
    optimizer = config.get("optimizer") or {}
    name = optimizer.get("type")
    if isinstance(name, str) and name.lower() not in {n.lower() for n in DEEPSPEED_OPTIMIZERS} \
            and not isinstance(getattr(torch.optim, name, None), type):
        torch_names = [n for n in dir(torch.optim) if isinstance(getattr(torch.optim, n), type) and n[0].isupper()]
        near = difflib.get_close_matches(name, [*DEEPSPEED_OPTIMIZERS, *torch_names], n=1, cutoff=0.6)
        found.append(f"optimizer.type: {shown(name)}: not an optimizer DeepSpeed knows (its own: "
                     f"{', '.join(DEEPSPEED_OPTIMIZERS)}; or a torch.optim class by its name)" +
                     (f"; did you mean {shown(near[0])}?" if near else ""))
    params = optimizer.get("params") or {}
    for key in NUMERIC_PARAMS:
        values = params.get(key) if isinstance(params.get(key), list) else [params.get(key)]
        if key in params and any(isinstance(v, str) or isinstance(v, bool) for v in values):
            found.append(f"optimizer.params.{key}: {shown(params[key])}: a number" +
                         (" (or a list of numbers)" if key == "betas" else ""))
    scheduler = (config.get("scheduler") or {}).get("type")
    if isinstance(scheduler, str):
        from deepspeed.runtime import lr_schedules
        if not hasattr(lr_schedules, scheduler) and not hasattr(torch.optim.lr_scheduler, scheduler):
            found.append(f"scheduler.type: {shown(scheduler)}: not a schedule DeepSpeed knows (its own: "
                         f"{', '.join(lr_schedules.VALID_LR_SCHEDULES)}; or a torch.optim.lr_scheduler class by its "
                         "name)")
    return found


def clipping_refusals(config):
    clip = config.get("gradient_clipping")
    if clip is None:
        return []
    if not isinstance(clip, (int, float)) or isinstance(clip, bool) or clip < 0:
        return [
            f"gradient_clipping: {shown(clip)}: a max norm of 0 or more (0, the default, turns clipping off; "
            "DeepSpeed takes a negative one for 0)"
        ]
    return []


def refusals(config, dp_world, sections, device):
    """Every refusal of ``config`` on ``dp_world`` data-parallel ranks (``sections``: its keys that hold keys)."""
    return (section_refusals(config, sections) + batch_refusals(config, dp_world) +
            precision_refusals(config, device) + optimizer_refusals(config) + clipping_refusals(config))


def _choices(text):
    """pydantic's "0, 1, 2, 3 or 3" (an enum with aliases), each choice once: "0, 1, 2 or 3"."""
    items = list(dict.fromkeys(re.split(r", | or ", text)))
    return ", ".join(items[:-1]) + " or " + items[-1] if len(items) > 1 else text


def pydantic_refusals(err, section_models, unknown):
    """A config model's ValidationError as one line per error, named by the user's dotted key; errors about keys
    already named as unknown (``unknown``) are left out. None when ``err`` is not one."""
    errors = getattr(err, "errors", None)
    title = getattr(err, "title", None)
    if not callable(errors) or title is None:
        return None
    section = next((key for key, model in section_models.items() if str(model).rsplit(".", 1)[-1] == title), None)
    lines = []
    for error in errors():
        key = ".".join([section] * (section is not None) + [str(part) for part in error["loc"]])
        if error["type"] == "extra_forbidden" and key in unknown:
            continue
        message = error["msg"]
        if message.startswith("Input should be "):
            message = "should be " + _choices(message[len("Input should be "):])
        elif error["type"] == "extra_forbidden":
            message = "not a key DeepSpeed reads"
        lines.append(f"{key}: {shown(error.get('input'))}: {message}")
    return lines


def json_error(path, text, err):
    """A JSON syntax error as the user fixes it: the line and column of the mistake, the line itself and a caret."""
    before = text[:err.pos].rstrip()
    if before.endswith(",") and text[err.pos:err.pos + 1] in "}]":
        pos, what = len(before) - 1, f"a trailing comma: JSON allows none before '{text[err.pos]}'"
    elif err.msg.startswith("Expecting ',' delimiter"):
        pos, what = len(before) - 1, "a comma is missing after this value"
    else:
        pos, what = err.pos, err.msg[0].lower() + err.msg[1:]
    line = text.count("\n", 0, pos) + 1
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    column = pos - start + 1
    source = text[start:end if end >= 0 else len(text)]
    return f"--config {path}: not valid JSON: line {line} column {column}: {what}\n  {source}\n  {' ' * (column - 1)}^"
