# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Training one split: the engine on the global batches, what it reports at each step, and nothing compared.

``SplitTraining.weights()`` yields this rank's owned fp32 master weights (ownership.py) before the first step and
after each; a caller keeps them or compares each as it comes. Its ``trained()`` then gives what the engine
reported: norms, losses (over every rank) and the steps it skipped.
"""

import copy
import gc
from dataclasses import dataclass

import torch

import deepspeed
import deepspeed.comm as dist
from deepspeed.accelerator import get_accelerator

from .batches import model_item_loss, model_loss, rows, to
from .optimizers import copy_muon_tags, tag_muon_parameters
from .ownership import check_coverage, owned_masters, spans, sum_over_ranks, values
from .restart import RestartError

SEED = 1234
LOOPS = ("step_every_micro_batch", "boundary", "step_once")


def per_item_mode(config):
    return config.get("loss_normalization", "mean") == "per_item"


def split_config(config, micro, gas):
    config = copy.deepcopy(config)
    config.pop("train_batch_size", None)
    config["train_micro_batch_size_per_gpu"] = micro
    config["gradient_accumulation_steps"] = gas
    # The pre-flight named the config's unknown keys once; the engine would again for every split.
    config["unknown_keys"] = "ignore"
    return config


@dataclass(frozen=True)
class Trained:
    """What the engine reported for one split."""
    norms: list  # per step: get_global_grad_norm() (nan when it reports none)
    losses: list  # per step: the mean micro-batch loss over every rank (per_item: the global item mean)
    skipped_steps: int  # steps the engine skipped (non-finite gradients): their update is zero


class SplitTraining:
    """One split of one config, trained on ``workload``'s global batches.

    ``loop``: "step_every_micro_batch" calls engine.backward() and engine.step() on every micro-batch
    (DeepSpeed's documented loop); "boundary" sets engine.set_gradient_accumulation_boundary() before
    each backward and calls step() once per global batch, as Hugging Face accelerate does; "step_once"
    calls backward() on every micro-batch and step() once, for ``managed_gradient_accumulation: false``.
    ``grouped``: what the split must give, without accumulation: one micro-batch of ``micro x gas`` samples per
    rank and step, whose loss is the mean of the losses of the split's ``gas`` micro-batches (the engine's
    contract under GAS, whatever the items per micro-batch).
    ``with_reference``: also keep an fp32 copy of the model as built (``reference_model``, ``reference_loss``)
    for the fp64 reference, taken before the engine casts or partitions it.
    ``restart`` (restart.Restart): save a checkpoint after the last step, or load one after the initial weights and
    train the steps after the one it was saved at. ``sequence`` (sequence.SequenceParallel): the engine gets its
    mpu, and each rank backpropagates its loss as that recipe writes it.
    """

    def __init__(self,
                 config,
                 workload,
                 micro,
                 gas,
                 loop,
                 progress,
                 index,
                 with_reference=False,
                 grouped=False,
                 restart=None,
                 sequence=None):
        self.config, self.workload, self.micro, self.gas, self.loop = config, workload, micro, gas, loop
        self.progress, self.index, self.grouped, self.restart = progress, index, grouped, restart
        self.sequence = sequence
        stages = workload.pipeline_stages
        self.engine_micro, self.engine_gas = (micro * gas, 1) if grouped else (micro, gas)
        engine_config = split_config(config, self.engine_micro, self.engine_gas)
        model = _seeded(workload.make_model, zero_init_config=engine_config if workload.zero_init else None)
        if config["optimizer"].get("type", "").lower() == "muon":
            tag_muon_parameters(model)
        trainable = _trainable(model, stages)
        if stages:
            self.reference_model, self.reference_loss = (_pipeline_reference(model) if with_reference else
                                                         (None, None))
        else:
            # A copy taken before the engine casts or partitions the model (ZeRO-3 empties its parameters); under
            # zero.Init it is partitioned already: the reference is built again, whole, from the same seed.
            self.reference_model = None
            if with_reference:
                self.reference_model = _seeded(workload.make_model) if workload.zero_init else copy.deepcopy(model)
            if self.reference_model is not None:
                copy_muon_tags(model, self.reference_model)
            self.reference_loss = workload.loss_fn
        if grouped and stages:
            model.loss_fn = _grouped_loss(model.loss_fn, micro, gas)
        mpu = None
        if sequence:  # after the reference's copy: that one attends over whole sequences
            mpu = sequence.mpu()
            sequence.attach(model)
        # The engine only: the optimizer and the rest it returns would outlive it in this object.
        self.engine = deepspeed.initialize(model=model,
                                           model_parameters=[p for p in model.parameters() if p.requires_grad],
                                           config=engine_config,
                                           mpu=mpu)[0]
        if workload.compiled:
            self.engine.compile()
        self.dp_rank = self.engine.grid.get_data_parallel_id() if stages else dist.get_rank()
        self.dp_world = dist.get_world_size() // (stages or 1)
        # Under sequence parallelism ZeRO partitions over every rank, but the ranks of a sequence-parallel group
        # hold chunks of the same samples.
        self.data_rank = sequence.data_rank(dist.get_rank()) if sequence else self.dp_rank
        initial = owned_masters(self.engine, self.dp_rank, self.dp_world)
        self.spans = spans(initial)
        check_coverage(self.spans, trainable)
        self._initial = values(initial)
        self._trained = None

    def weights(self):
        """This rank's owned weights before the first step, then after each step; the engine is gone at the end.
        Resuming (``restart``): the initial weights, those it loaded, then after each step it trains."""
        initial, self._initial = self._initial, None
        yield initial
        del initial
        first = 0
        if self.restart is not None and self.restart.resume:
            self._resume()
            first = self.restart.step
            yield values(owned_masters(self.engine, self.dp_rank, self.dp_world))
        norms, losses, item_sums, item_counts = [], [], [], []
        for step, batch in enumerate(self.workload.batches[first:], first):
            loss, total, items = self._train_step(batch)
            losses.append(loss)
            item_sums.append(total)
            item_counts.append(items)
            norm = self.engine.get_global_grad_norm()
            norms.append(float("nan") if norm is None else float(norm))
            yield values(owned_masters(self.engine, self.dp_rank, self.dp_world))
            self.progress.step(self.index, self._what(), step + 1, len(self.workload.batches))
        skipped_steps = self.engine.skipped_steps
        if self.restart is not None and not self.restart.resume:
            self.engine.save_checkpoint(self.restart.directory)
        self.engine.destroy()
        self.engine = None
        gc.collect()  # the engine's partitions and buffers, before the next split builds its own
        get_accelerator().empty_cache()
        self._trained = Trained(norms, self._losses_over_ranks(losses, item_sums, item_counts), skipped_steps)

    def _resume(self):
        """Load the checkpoint the restart saved, as a training script resuming on this run's ranks would."""
        directory, step = self.restart.directory, self.restart.step
        try:
            path, _ = self.engine.load_checkpoint(directory)
        except Exception as err:  # what the engine raises is the finding: the config does not resume here
            raise RestartError(f"the engine could not resume from {directory} on {dist.get_world_size()} rank(s): "
                               f"{type(err).__name__}: {err}") from err
        if path is None:
            raise RestartError(f"load_checkpoint found no checkpoint in {directory}")
        if self.engine.global_steps != step:
            raise RestartError(f"the checkpoint in {directory} resumed at step {self.engine.global_steps}, not at "
                               f"step {step} where it was saved")

    def trained(self):
        """What the engine reported; call after ``weights()`` is exhausted."""
        if self._trained is None:
            raise RuntimeError("SplitTraining.trained() before its weights() were all taken")
        return self._trained

    def _what(self):
        return f"split {self.micro} x {self.gas} x {dist.get_world_size()}" + (" without accumulation"
                                                                               if self.grouped else "")

    def _train_step(self, batch):
        """One global batch: this rank's mean micro-batch loss, their sum, and its items (per_item mode)."""
        engine, workload = self.engine, self.workload
        per_rank = self.micro * self.gas
        dtype = next(engine.module.parameters()).dtype
        device = get_accelerator().current_device_name()
        local = rows(batch, self.data_rank * per_rank, (self.data_rank + 1) * per_rank)
        if self.sequence:
            local = self.sequence.chunk(local)
        micro_batches = [
            to(rows(local, i * self.engine_micro, (i + 1) * self.engine_micro), device, dtype)
            for i in range(self.engine_gas)
        ]
        if workload.pipeline_stages:
            loss = float(engine.train_batch(data_iter=iter(micro_batches)))
            return loss, loss, 0.0
        per_item = per_item_mode(self.config)
        # gradient_allreduce_op "sum" adds the ranks' gradients: its callers normalize their loss over
        # the global batch, so the per-rank mean is divided by the number of data-parallel ranks (per_item
        # mode divides by the global item count itself).
        loss_divisor = dist.get_world_size() if self.config.get("gradient_allreduce_op", "mean") == "sum" else 1
        groups = self.gas if self.grouped else 1
        total, items = 0.0, 0.0
        for i, micro_batch in enumerate(micro_batches):
            last = i == self.engine_gas - 1
            if self.loop == "boundary":
                engine.set_gradient_accumulation_boundary(last)
            if per_item:
                loss, count = model_item_loss(engine, micro_batch, workload.loss_fn)
                engine.backward(loss, num_items=count)
                items += count.item()
            else:
                # grouped: the mean of the split's micro-batch losses, one forward each, one backward
                parts = [
                    model_loss(engine, rows(micro_batch, k * self.micro, (k + 1) * self.micro), workload.loss_fn)
                    for k in range(groups)
                ] if self.grouped else [model_loss(engine, micro_batch, workload.loss_fn)]
                loss = sum(parts) / len(parts)
                engine.backward((self.sequence.backpropagated(loss) if self.sequence else loss) / loss_divisor)
            total += loss.item()
            if self.loop == "step_every_micro_batch" or last:
                engine.step()
        return total / self.engine_gas, total, items

    def _losses_over_ranks(self, losses, item_sums, item_counts):
        if self.workload.pipeline_stages:  # the pipeline engine's loss is already the mean over its data-parallel ranks
            return losses
        if per_item_mode(self.config):  # the sum of every rank's item losses over the global item count
            totals = sum_over_ranks(item_sums + item_counts)
            return [total / max(count, 1.0) for total, count in zip(totals[:len(losses)], totals[len(losses):])]
        return [value / dist.get_world_size() for value in sum_over_ranks(losses)]


def _seeded(make_model, zero_init_config=None):
    """Build a model under the fixed seed: every rank and every split starts from the same weights. With
    ``zero_init_config``, under ``deepspeed.zero.Init`` for that config: each parameter is initialised whole, then
    partitioned."""
    torch.manual_seed(SEED)
    if zero_init_config is None:
        return make_model()
    with deepspeed.zero.Init(config_dict_or_path=zero_init_config):
        return make_model()


class LayerChain(torch.nn.Module):
    """A PipelineModule's layers in one process, named as the PipelineModule names them (the layer index)."""

    def __init__(self, layers):
        super().__init__()
        self.calls = []
        for index, layer in enumerate(layers):
            if hasattr(layer, "build"):  # LayerSpec
                if hasattr(layer, "key"):
                    raise ValueError("a PipelineModule with TiedLayerSpec: the checker's reference does not "
                                     "support tied layers")
                layer = layer.build()
            if isinstance(layer, torch.nn.Module):
                layer = copy.deepcopy(layer)
                self.add_module(str(index), layer)
            self.calls.append(layer)

    def forward(self, inputs):
        for call in self.calls:
            inputs = call(inputs)
        return inputs


def _pipeline_reference(module):
    """A plain-module twin of a PipelineModule and its loss function."""
    loss_fn = module.loss_fn
    if loss_fn is None:
        raise ValueError("the PipelineModule has no loss_fn: the pipeline engine needs one")
    return LayerChain(module._layer_specs), loss_fn


def _grouped_loss(loss_fn, micro, groups):
    """A pipeline's loss on ``groups`` x ``micro`` samples: the mean of its loss on each ``micro`` of them."""

    def part(value, k):
        if torch.is_tensor(value):
            return value[k * micro:(k + 1) * micro]
        return type(value)(part(v, k) for v in value)

    def loss(outputs, labels):
        return sum(loss_fn(part(outputs, k), part(labels, k)) for k in range(groups)) / groups

    return loss


def _trainable_count(workload):
    """The model's trainable parameters (all pipeline stages), built on the meta device where the factory allows."""
    try:
        with torch.device("meta"):
            model = _seeded(workload.make_model)
    except Exception:  # a factory that reads weights from disk, or a layer that needs data: build it for real
        model = _seeded(workload.make_model)
    return _trainable(model, workload.pipeline_stages)


def _trainable(model, stages):
    """Trainable parameters of the whole model: a pipeline stage's module holds its own layers only, and each of
    the stage's data-parallel ranks counts them (a collective with ``stages``)."""
    # ds_numel: a parameter built under zero.Init holds only its partition
    count = float(sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters() if p.requires_grad))
    if stages:
        return sum_over_ranks([count])[0] / (dist.get_world_size() // stages)
    return count
