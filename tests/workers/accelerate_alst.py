# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker, run by ``accelerate launch --use_deepspeed``: accelerate's ALST / Ulysses sequence-parallel recipe
(its test script ``test_utils/scripts/external_deps/test_ds_alst_ulysses_sp.py``) for one optimizer step, with the
engine's grad norm and update read against fp64 PyTorch on the whole sequence.

What the script does, this does: ``ParallelismConfig(sp_backend="deepspeed", sp_size=2)``, a Llama prepared by
accelerate (which registers ALST with transformers and wraps the dataloader in ``UlyssesSPDataLoaderAdapter``),
each SP rank's loss the chunk losses gathered with ``torch.distributed.nn.functional.all_gather`` and weighted by
their token counts, ``accelerator.backward``. Two things differ so that the numbers can be judged: fp32 (the
script runs bf16) and SGD with clipping above the norm, so the update is the gradient itself. The ZeRO stage,
gradient accumulation and clipping come from ``accelerate launch``'s options, as in accelerate's test.

Reference: an fp64 copy of the model takes the same micro-batches whole, loss the token mean per micro-batch
averaged over the accumulation steps (what the engine's 1/GAS scaling gives), and SGD's step.
"""

import copy
import os

import torch  # noqa: E402

from helpers.engine_paths import relative_update_error  # noqa: E402
from helpers.rank_cases import run_cases  # noqa: E402
from hf_training import tiny_models  # noqa: E402

SP = 2
SEQUENCE = 32
LR = 0.1


def tiny_llama():
    # sdpa: the attention ALST is registered for (accelerate's script asks for it).
    return tiny_models.from_settings(tiny_models.CONFIGS["llama"], attn_implementation="sdpa")


def samples(count):
    """This rank's samples, other than every other rank's: as if the loader were sharded over the SP ranks (accelerate
    leaves it whole when the data-parallel degree is 1, and the adapter would then take one sample SP times)."""
    generator = torch.Generator().manual_seed(1 + torch.distributed.get_rank())
    input_ids = torch.randint(1, tiny_models.VOCAB_SIZE, (count, SEQUENCE), generator=generator)
    position_ids = torch.arange(SEQUENCE).expand(count, SEQUENCE)
    return torch.utils.data.TensorDataset(input_ids, position_ids)


def collate(batch):
    input_ids, position_ids = batch[0]
    return dict(input_ids=input_ids.unsqueeze(0),
                position_ids=position_ids.unsqueeze(0),
                labels=input_ids.unsqueeze(0))


def reference_step(model, micro_batches, clip):
    """fp64 norm and weights after SGD's step, the whole sequences on one process (``model``: an fp64 copy)."""
    for input_ids in micro_batches:
        (model(input_ids=input_ids, labels=input_ids).loss / len(micro_batches)).backward()
    norm = torch.sqrt(sum((p.grad**2).sum() for p in model.parameters()))
    coefficient = min(1.0, clip / (float(norm) + 1e-6)) if clip > 0 else 1.0
    return float(norm), {name: (p - LR * coefficient * p.grad).detach() for name, p in model.named_parameters()}


def whole_sequence(chunk, sp_group):
    """The micro-batch's input ids as the SP ranks hold them together: what the reference takes."""
    chunks = [torch.zeros_like(chunk) for _ in range(SP)]
    torch.distributed.all_gather(chunks, chunk.contiguous(), group=sp_group)
    return torch.cat(chunks, dim=1)


def gathered_loss(model, outputs, batch, sp_group):
    """The script's loss: each chunk's token mean, gathered over the SP ranks and weighted by token counts."""
    shift_labels = batch["shift_labels"]
    loss = model.loss_function(logits=outputs.logits,
                               labels=None,
                               shift_labels=shift_labels,
                               vocab_size=model.config.vocab_size)
    losses = torch.distributed.nn.functional.all_gather(loss, group=sp_group)
    tokens = (shift_labels != -100).view(-1).sum()
    tokens_per_rank = torch.distributed.nn.functional.all_gather(tokens, group=sp_group)
    total = sum(losses[rank] * tokens_per_rank[rank] for rank in range(SP) if tokens_per_rank[rank] > 0)
    return total / max(sum(tokens_per_rank), 1)


def alst_step():
    import deepspeed
    from accelerate import Accelerator
    from accelerate.utils import ParallelismConfig
    from accelerate.utils.dataclasses import DeepSpeedSequenceParallelConfig
    from deepspeed.utils import groups

    model = tiny_llama()
    reference = copy.deepcopy(model).double()
    # ALST replaces transformers' "sdpa" attention with its all-to-all wrapper process-wide: the reference, whole
    # sequences on one process, takes the eager attention instead (the same math).
    reference.config._attn_implementation = "eager"
    before = {name: p.detach().clone().double() for name, p in model.named_parameters()}
    accelerator = Accelerator(parallelism_config=ParallelismConfig(
        sp_backend="deepspeed",
        sp_size=SP,
        sp_handler=DeepSpeedSequenceParallelConfig(
            sp_seq_length=SEQUENCE * 8, sp_seq_length_is_variable=True, sp_attn_implementation="sdpa")))
    gas = accelerator.gradient_accumulation_steps
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    loader = torch.utils.data.DataLoader(samples(gas), batch_size=1, collate_fn=collate)
    engine, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    unwrapped = accelerator.unwrap_model(engine)
    sp_group = groups._get_sequence_parallel_group()
    micro_batches = []
    # One optimizer step: the first GAS micro-batches the adapter yields, inside accumulate() as accelerate's
    # gradient-accumulation recipe has it.
    for _, batch in zip(range(gas), loader):
        batch = {key: value.to(engine.device) for key, value in batch.items()}
        micro_batches.append(whole_sequence(batch["input_ids"], sp_group))
        with accelerator.accumulate(engine):
            outputs = engine(**batch)
            accelerator.backward(gathered_loss(unwrapped, outputs, batch, sp_group))
            optimizer.step()
            optimizer.zero_grad()
    clip = float(accelerator.state.deepspeed_plugin.deepspeed_config.get("gradient_clipping") or 0.0)
    reference_norm, expected = reference_step(reference, micro_batches, clip)
    params = dict(unwrapped.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):
        after = {name: p.detach().clone().double() for name, p in params.items()}
        dtype = next(iter(params.values())).dtype
    names = sorted(expected)
    norm = engine.get_global_grad_norm()
    return {
        "zero_stage":
        engine.zero_optimization_stage(),
        "dtype":
        str(dtype),
        "gas":
        gas,
        "global_steps":
        engine.global_steps,
        "norm":
        None if norm is None else float(norm),
        "reference_norm":
        reference_norm,
        "update_error":
        relative_update_error([after[n] for n in names], [expected[n] for n in names], [before[n] for n in names]),
    }


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    run_cases({"alst_step": alst_step})
