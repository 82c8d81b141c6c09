# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The grid: model x padding x loss kwargs x backend x split, and how one case is judged.

A split is micro-batch x GAS per rank; every split of a launch covers the same global batch.
``loss_kwargs`` "model" leaves ``model_accepts_loss_kwargs`` as the Trainer finds it (True for
Llama and Qwen3), "off" forces it False: the model then returns its own per-micro-batch mean.
"""

import itertools
from dataclasses import dataclass

from .batches import GLOBAL_BATCH
from .trainer_run import BACKENDS

MODELS = ("llama", "qwen3")
PADDINGS = ("padded", "unpadded")
LOSS_KWARGS = ("model", "off")
SPLITS = {1: ((1, 8), (8, 1)), 2: ((1, 4), )}  # world size -> (micro-batch, GAS) per rank


@dataclass(frozen=True)
class Case:
    model: str
    padding: str
    loss_kwargs: str
    backend: str
    micro_batch: int
    gas: int

    @property
    def name(self):
        return f"{self.model}-{self.padding}-kwargs_{self.loss_kwargs}-{self.backend}-{self.split}"

    @property
    def split(self):
        return f"mb{self.micro_batch}xgas{self.gas}"

    @property
    def baseline(self):
        """The same case without DeepSpeed."""
        return Case(self.model, self.padding, self.loss_kwargs, "none", self.micro_batch, self.gas)

    def objective_micro_batch(self):
        """None: the global token mean; else the micro-batch size whose means are averaged."""
        return None if self.loss_kwargs == "model" else self.micro_batch


def grid(world_size):
    """Every case of a launch with ``world_size`` ranks; the no-DeepSpeed baselines first."""
    cases = []
    for micro_batch, gas in SPLITS[world_size]:
        assert micro_batch * gas * world_size == GLOBAL_BATCH
        for model, padding, loss_kwargs, backend in itertools.product(MODELS, PADDINGS, LOSS_KWARGS, BACKENDS):
            cases.append(Case(model, padding, loss_kwargs, backend, micro_batch, gas))
    return sorted(cases, key=lambda case: case.backend != "none")


def find(world_size, name):
    for case in grid(world_size):
        if case.name == name:
            return case
    raise KeyError(f"no case '{name}' in the {world_size}-rank grid")


def compare(applied, reference):
    """Per step: least-squares factor applied/reference and relative error of the applied gradient."""
    factors, errors = [], []
    for got, want in zip(applied, reference):
        factors.append(float(got.dot(want) / want.dot(want)))
        errors.append(float((got - want).norm() / want.norm()))
    return factors, errors
