# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What one check trains and how, in the engine's terms: the library's options (``check_gas_invariance`` takes them
as keywords), set once and passed whole. ``cli.py`` translates the command line's flags into them."""

from dataclasses import dataclass

DEFAULT_SPLITS = ((16, 1), (8, 2), (4, 4), (2, 8))
LOOPS = ("step_every_micro_batch", "boundary", "step_once")
ITEMS = ("fixed", "variable")


@dataclass(frozen=True)
class CheckOptions:
    """``make_model``: a no-argument factory (None: a small MLP; with ``pipeline_stages``, that MLP in stages).
    ``splits``: per-rank ``(micro-batch, GAS)`` pairs of the same per-rank batch. ``data``: ``(steps,
    global_batch_size) -> batches`` (None: the MLP's); ``loss_fn``: ``(outputs, labels) -> loss`` (None: the model
    returns it; the built-in data uses mean squared error). ``items``: "fixed" (a sample is an item) or "variable"
    (built-in samples of 0-12 labelled positions). ``reference``: True (the fp64 reference), False (each split
    against its own micro-batches without accumulation), "auto" (False for a model too large for an fp64 copy on
    every rank). ``loop``: the training loop's style (``SplitTraining``). ``small_buckets``: ZeRO's bucket, prefetch
    and sub-group sizes scaled to the model. ``sequence`` (sequence.SequenceParallel): Ulysses sequence parallelism.
    ``zero_init``: the engine's model built under ``deepspeed.zero.Init``. ``compiled``: the engine compiled
    (``engine.compile()``) before it trains."""
    make_model: object = None
    splits: tuple = DEFAULT_SPLITS
    steps: int = 3
    pipeline_stages: int = 0
    loop: str = LOOPS[0]
    data: object = None
    loss_fn: object = None
    reference: object = "auto"
    items: str = "fixed"
    small_buckets: bool = False
    sequence: object = None
    zero_init: bool = False
    compiled: bool = False

    def refusal(self, world):
        """What makes these options impossible on ``world`` ranks, in one line naming the option; None when
        nothing does."""
        stages, sequence = self.pipeline_stages, self.sequence
        if len({micro * gas for micro, gas in self.splits}) != 1:
            return f"splits {list(self.splits)}: micro-batch x GAS must be the same for all, to keep the global batch"
        if self.items not in ITEMS:
            return f"--items {self.items!r}: choose fixed or variable"
        if stages and world % stages:
            return f"{stages} pipeline stages do not divide {world} ranks"
        if sequence and stages:
            return "--sequence-parallel and --pipeline-stages: the pipeline engine takes no sequence-parallel mpu"
        if sequence and world % sequence.size:
            return f"--sequence-parallel {sequence.size} does not divide {world} ranks"
        if self.zero_init and (stages or sequence):
            return "--zero-init: not with --pipeline-stages or --sequence-parallel"
        return None
