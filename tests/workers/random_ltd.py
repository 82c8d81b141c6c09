# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker (2 ranks): random-LTD (``data_efficiency.data_routing.random_ltd``), at several splits of one global
batch of 8 sequences (micro-batch x GAS per rank 4x1, 2x2, 1x4), two steps.

A model of three residual blocks over sequences of 8 tokens (hidden size 8), then a mean over the tokens and a head.
``deepspeed.runtime.data_pipeline.data_routing.helper.convert_to_random_ltd`` wraps the blocks; the config drops
tokens in blocks 1 and 2: each micro-batch draws, per sequence, the tokens those blocks see (the rest pass them by),
as many as the schedule allows at that step (``fixed_linear`` from 4 of 8 tokens at step 0 to 6 at step 1). The
token gather and scatter are a CUDA op (``RandomLTDBuilder``); here they run as the same index operations in torch.

Each case records the tokens each micro-batch drew (the scheduler's sample index after its forward) and trains two
steps of SGD without clipping; the fp64 reference trains the same steps with each micro-batch's own draw, its losses
over GAS summed over the micro-steps and averaged over the ranks; and, as a control, against a reference that keeps
every token. Case names ``<path>_m<micro>_g<gas>``.
"""

import torch  # noqa: E402

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
from helpers.engine_paths import BF16, relative_update_error  # noqa: E402
from helpers.master_weights import zero_master_weights  # noqa: E402
from helpers.rank_cases import run_cases  # noqa: E402
from helpers.small_model import sgd_config  # noqa: E402

GLOBAL_BATCH, TOKENS, HIDDEN, BLOCKS, STEPS, LR = 8, 8, 8, 3, 2, 0.1
DROPPING = [1, 2]  # the blocks random-LTD wraps
SCHEDULE = [4, 6]  # tokens kept per step: min 4, +2 a step (require_steps 2 to reach all 8)
SPLITS = [(4, 1), (2, 2), (1, 4)]
PATHS = {"zero1_fp32": (1, {}), "zero3_fp32": (3, {}), "zero2_bf16": (2, BF16)}  # path -> (ZeRO stage, extra config)


class TorchRandomLTD:
    """The random_ltd op's token sort, gather and scatter as torch index operations (the op is CUDA only)."""

    @staticmethod
    def token_sort_(indices, tokens):
        return indices.sort(dim=-1).values

    @staticmethod
    def token_gather(activations, indices, batch_first):
        seq_first = activations if batch_first else activations.transpose(0, 1)
        picked = torch.stack([seq_first[b, indices[b].long()] for b in range(indices.shape[0])])
        return (picked if batch_first else picked.transpose(0, 1)).contiguous()

    @staticmethod
    def token_scatter_(all_activations, layer_activations, indices, batch_first):
        into = all_activations if batch_first else all_activations.transpose(0, 1)
        values = layer_activations if batch_first else layer_activations.transpose(0, 1)
        for b in range(indices.shape[0]):
            into[b, indices[b].long()] = values[b]
        return all_activations


class Block(torch.nn.Module):

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, hidden):
        return hidden + torch.tanh(self.linear(hidden))


class Model(torch.nn.Module):

    def __init__(self):
        super().__init__()
        torch.manual_seed(1234)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(BLOCKS))
        self.head = torch.nn.Linear(HIDDEN, 2)

    def forward(self, hidden, kept=None):
        """``kept``: block -> the tokens it sees per sequence ([batch, kept]), as random-LTD drew them (reference)."""
        for index, block in enumerate(self.blocks):
            if kept is not None and index in kept:
                rows = torch.arange(hidden.shape[0]).view(-1, 1)
                hidden = hidden.clone()
                hidden[rows, kept[index]] = block(hidden[rows, kept[index]])
            else:
                hidden = block(hidden)
        return self.head(hidden.mean(dim=1))


def batch():
    gen = torch.Generator().manual_seed(4321)
    return torch.randn(GLOBAL_BATCH, TOKENS, HIDDEN, generator=gen), torch.randn(GLOBAL_BATCH, 2, generator=gen)


def loss_of(output, target):
    return torch.nn.functional.mse_loss(output.float(), target.float())


def config(path, micro, gas):
    stage, extra = PATHS[path]
    return {
        **sgd_config(micro, gas, 0.0, LR),
        "zero_optimization": {
            "stage": stage
        },
        "data_efficiency": {
            "enabled": True,
            "data_routing": {
                "enabled": True,
                "random_ltd": {
                    "enabled": True,
                    "total_layer_num": BLOCKS,
                    "random_ltd_layer_num": len(DROPPING),
                    "random_ltd_layer_id": DROPPING,
                    "model_mask_name": None,
                    "model_type": "decoder",
                    "hidden_state_order": "batch_seq_dim",
                    "random_ltd_schedule": {
                        "min_value": SCHEDULE[0],
                        "max_value": TOKENS,
                        "schedule_type": "fixed_linear",
                        "schedule_config": {
                            "require_steps": 2,
                            "seq_per_step": SCHEDULE[1] - SCHEDULE[0]
                        }
                    }
                }
            }
        },
        **extra,
    }


def unwrapped(weights):
    """``weights`` by the model's own names (random-LTD's wrapper adds ``.random_ltd_layer`` to its layer's)."""
    return {name.replace(".random_ltd_layer", ""): value for name, value in weights.items()}


def reference_training(draws, gas, drop=True):
    """Two SGD steps of the fp64 model on every rank's micro-batches, each with its own draw (``drop``) or every
    token; the weights by name."""
    reference = Model().double()
    world = dist.get_world_size()
    for step in range(STEPS):
        reference.zero_grad()
        for (x, y), kept in draws[step]:
            (loss_of(reference(x.double(), kept if drop else None), y.double()) / gas / world).backward()
        with torch.no_grad():
            for param in reference.parameters():
                param -= LR * param.grad
    return {name: param.detach() for name, param in reference.named_parameters()}


def case(path, micro, gas):

    def run():
        from deepspeed.ops.random_ltd import dropping_utils
        from deepspeed.runtime.data_pipeline.data_routing.helper import convert_to_random_ltd
        dropping_utils.random_ltd_module = TorchRandomLTD
        model = Model()
        engine, *_ = deepspeed.initialize(model=model,
                                          model_parameters=model.parameters(),
                                          config=config(path, micro, gas))
        convert_to_random_ltd(engine, Block)
        dtype = next(engine.module.parameters()).dtype
        rank, per_rank = engine.global_rank, micro * gas
        inputs, targets = batch()
        before = unwrapped(zero_master_weights(engine))
        mine = []  # per step: ((inputs, target), {block: kept tokens}) of each micro-batch
        for _ in range(STEPS):
            step = []
            for i in range(gas):
                start = rank * per_rank + i * micro
                x, y = inputs[start:start + micro], targets[start:start + micro]
                engine.backward(loss_of(engine(x.to(dtype)), y))
                drawn = engine.random_ltd_scheduler.state["sample_idx"].long()  # [dropping blocks, micro, kept]
                step.append(((x.to(dtype), y), {block: drawn[k] for k, block in enumerate(DROPPING)}))
                engine.step()
            mine.append(step)
        after = unwrapped(zero_master_weights(engine))
        engine.destroy()
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        draws = [[micro_batch for rank_steps in everyone for micro_batch in rank_steps[step]] for step in range(STEPS)]
        expected, every_token = reference_training(draws, gas), reference_training(draws, gas, drop=False)
        names = sorted(expected)

        def error_to(reference):
            return relative_update_error(*([d[n] for n in names] for d in (after, reference, before)))

        return {
            "kept_per_step": [sorted({kept.shape[-1]
                                      for _, d in step
                                      for kept in d.values()}) for step in mine],
            "update_error": error_to(expected),
            "update_error_to_every_token": error_to(every_token),  # a reference blind to the draws: the control
        }

    return run


if __name__ == "__main__":
    run_cases({f"{p}_m{m}_g{g}": case(p, m, g) for p in PATHS for m, g in SPLITS})
