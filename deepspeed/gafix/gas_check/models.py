# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Models to check with: a small built-in MLP, or the user's factory ``module:function``."""

import importlib

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


def load_model_factory(spec):
    """``"package.module:function"`` -> the function; it takes no argument and returns an nn.Module
    mapping a float tensor [batch, 8] to [batch, 4] (the checker's data)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--model '{spec}': expected 'module:function'")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"--model '{spec}': {err}") from None
    if not callable(factory):
        raise ValueError(f"--model '{spec}': {attr} is not callable")
    return factory
