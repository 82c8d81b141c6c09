# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Models to check with: a small built-in MLP, or the user's factory ``module:function``."""

import importlib
import math
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


class BuiltinModel(torch.nn.Sequential):
    """The built-in MLP: its layers in order, with a forward of its own. torch.compile compiles a model's own forward
    and leaves torch's code to run eager, so a plain ``nn.Sequential`` of torch's layers would run eager under
    ``engine.compile()`` (``--compile``); this one compiles, under the same parameter names."""

    def forward(self, x):
        for layer in self:
            x = layer(x)
        return x


def builtin_model():
    return BuiltinModel(*builtin_layers())


def attention(query, key, value, *args, **kwargs):
    """Softmax attention over every position, on ``[batch, sequence, heads, head size]``."""
    scores = torch.einsum("bshd,bthd->bhst", query, key) / math.sqrt(query.shape[-1])
    return torch.einsum("bhst,bthd->bshd", scores.softmax(dim=-1), value)


class UlyssesModel(torch.nn.Module):
    """The built-in model under sequence parallelism: ``[batch, sequence, IN_FEATURES]`` to ``[batch, sequence,
    OUT_FEATURES]`` through one self-attention layer. With ``sequence_group`` set (the engine's copy), each rank holds
    its chunk of the sequence and the attention is DeepSpeed's Ulysses ``DistributedAttention``: an all-to-all gives
    each rank every position of its heads, and another gives back its chunk of every head; without it (the fp64
    reference), the same attention over the whole sequence."""

    def __init__(self, heads):
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Linear(IN_FEATURES, HIDDEN)
        self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
        self.out = torch.nn.Linear(HIDDEN, OUT_FEATURES)
        self.sequence_group = None

    def forward(self, x):
        batch, length, _ = x.shape
        hidden = self.embed(x)
        qkv = self.qkv(torch.tanh(hidden)).view(batch, length, 3, self.heads, HIDDEN // self.heads)
        query, key, value = (t.contiguous() for t in qkv.unbind(dim=2))
        if self.sequence_group is None:
            mixed = attention(query, key, value)
        else:
            from deepspeed.sequence.layer import DistributedAttention
            mixed = DistributedAttention(attention, self.sequence_group, scatter_idx=2, gather_idx=1)(query,
                                                                                                      key,
                                                                                                      value,
                                                                                                      batch_dim_idx=0)
        hidden = hidden + self.proj(mixed.reshape(batch, length, HIDDEN))
        return self.out(torch.tanh(hidden))


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
