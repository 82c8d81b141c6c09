# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Counts what a piece of engine code costs in synchronisation: reducing collectives of
deepspeed.comm and host reads of tensor values."""

import torch

import deepspeed.comm as dist

REDUCING = ("all_reduce", "all_reduce_coalesced", "inference_all_reduce", "reduce")
HOST_READS = ("item", "__bool__", "__float__", "tolist")


class CollectiveCounter:
    """Counts the reducing collectives of deepspeed.comm while active (the module functions are
    wrapped; every DeepSpeed component calls them through the module), and the host reads of
    tensor values (``item()``, ``bool()``, ``float()``, ``tolist()``: each a device sync on an accelerator)."""

    def __init__(self, names=REDUCING):
        self.names = names  # the deepspeed.comm functions counted
        self.calls = []
        self.host_reads = 0
        self._saved = {}
        self._originals = {}

    def _count_host_reads(self):
        self._originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}
        for name, original in self._originals.items():

            def counted(tensor, *args, _original=original, **kwargs):
                self.host_reads += 1
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, counted)

    def __enter__(self):
        self._count_host_reads()
        for name in self.names:
            original = getattr(dist, name, None)
            if original is None:
                continue
            self._saved[name] = original

            def counted(*args, _name=name, _original=original, **kwargs):
                self.calls.append(_name)
                return _original(*args, **kwargs)

            setattr(dist, name, counted)
        return self

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(dist, name, original)
        for name, original in self._originals.items():
            setattr(torch.Tensor, name, original)


def train_step_counting_collectives(engine, losses):
    """One optimizer step of ``engine``: ``engine.backward`` of each micro-batch's loss, then
    ``engine.step()`` with its reducing collectives counted (every micro-batch's: only the boundary's
    reduces). ``losses`` yields ``(loss, backward keyword arguments)`` per micro-batch, lazily, so each
    forward runs after the previous micro-batch's step. Returns the collective counts (the boundary step's, the
    others') and the engine's global grad norm (None where the engine computed none), as a worker reports them."""
    counts = []
    for loss, backward_kwargs in losses:
        engine.backward(loss, **backward_kwargs)
        with CollectiveCounter() as counter:
            engine.step()
        counts.append(len(counter.calls))
    norm = engine.get_global_grad_norm()
    return {
        "collectives_in_boundary_step": counts[-1],
        "collectives_in_other_steps": counts[:-1],
        "norm": None if norm is None else float(norm),
    }


def pipeline_batch_counting_collectives(engine, batches):
    """One ``engine.train_batch()`` of a PipelineEngine over ``batches`` (its micro-batches), the reducing collectives
    of its model step counted (``_take_model_step``, where the norm and the overflow check run; the pipeline's own
    sends and gradient reduction are not). Returns them as ``train_step_counting_collectives`` does."""
    counts, take_model_step = [], engine._take_model_step

    def counted_model_step(*args, **kwargs):
        with CollectiveCounter() as counter:
            take_model_step(*args, **kwargs)
        counts.append(len(counter.calls))

    engine._take_model_step = counted_model_step
    try:
        engine.train_batch(data_iter=iter(batches))
    finally:
        del engine._take_model_step
    norm = engine.get_global_grad_norm()
    return {"collectives_in_boundary_step": counts[-1], "norm": None if norm is None else float(norm)}
