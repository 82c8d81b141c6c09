# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Models to check with: a small built-in MLP, or the user's factory ``module:function``."""

import importlib
import os
import sys

import torch

IN_FEATURES, HIDDEN, OUT_FEATURES = 8, 32, 4


def builtin_layers():
    """The layers of the built-in model; call under a fixed seed so every rank builds the same weights."""
    return [
        torch.nn.Linear(IN_FEATURES, HIDDEN),
        torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, OUT_FEATURES),
    ]


def builtin_model():
    return torch.nn.Sequential(*builtin_layers())


def load_factory(spec, option="--model"):
    """``"package.module:function"`` -> the function (``option`` names the command-line flag in errors)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{option} '{spec}': expected 'module:function'")
    if "" not in sys.path and os.getcwd() not in sys.path:
        # The ds_gas_check script, unlike python -m, does not put the working directory on the path.
        sys.path.append(os.getcwd())
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{option} '{spec}': {err}") from None
    if not callable(factory):
        raise ValueError(f"{option} '{spec}': {attr} is not callable")
    return factory


def load_model_factory(spec):
    """``--model``: a function of no argument returning an nn.Module (a PipelineModule for the pipeline engine)."""
    return load_factory(spec, "--model")
