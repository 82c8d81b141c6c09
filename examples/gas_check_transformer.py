# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Factories for ``ds_gas_check`` on your own model and data: a small causal transformer on padded
token batches. Copy this file, put your model, data and loss in its three functions, and run

    ds_gas_check --config ds_config.json --ranks 2 \\
        --model gas_check_transformer:make_model --data gas_check_transformer:make_batches \\
        --loss gas_check_transformer:token_loss

(from this directory, or with it on PYTHONPATH). The pipeline engine takes a PipelineModule from
``make_pipeline`` and (inputs, labels) tuples: ``--pipeline-stages 2 --model
gas_check_transformer:make_pipeline --data gas_check_transformer:make_pipeline_batches``.
"""

import torch

VOCAB, WIDTH, HEADS, LAYERS, SEQ = 64, 32, 4, 2, 12


class Block(torch.nn.Module):
    """A pre-norm causal transformer layer (dropout 0: the check compares runs of the same function)."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(WIDTH,
                                                      HEADS,
                                                      dim_feedforward=2 * WIDTH,
                                                      dropout=0.0,
                                                      batch_first=True,
                                                      norm_first=True)

    def forward(self, hidden):
        causal = torch.nn.Transformer.generate_square_subsequent_mask(hidden.shape[1], dtype=hidden.dtype)
        return self.layer(hidden, src_mask=causal.to(hidden.device), is_causal=True)


class Embed(torch.nn.Module):

    def __init__(self):
        super().__init__()
        self.tokens = torch.nn.Embedding(VOCAB, WIDTH)
        self.positions = torch.nn.Parameter(torch.randn(SEQ, WIDTH) * 0.02)

    def forward(self, ids):
        return self.tokens(ids) + self.positions[:ids.shape[1]]


def layers():
    return [Embed(), *[Block() for _ in range(LAYERS)], torch.nn.LayerNorm(WIDTH), torch.nn.Linear(WIDTH, VOCAB)]


class TinyTransformer(torch.nn.Module):

    def __init__(self):
        super().__init__()
        self.stack = torch.nn.Sequential(*layers())

    def forward(self, input_ids, attention_mask=None):
        # Padding sits after the real tokens and is left out of the loss: causal attention never lets a
        # real token see it, so the mask is not needed here.
        return self.stack(input_ids)


def make_model():
    return TinyTransformer()


def make_batches(steps, global_batch_size, seed=7):
    """One dict batch per step; every sample has 3..SEQ real tokens, then padding (label -100)."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        ids = torch.randint(0, VOCAB, (global_batch_size, SEQ), generator=gen)
        lengths = torch.randint(3, SEQ + 1, (global_batch_size, ), generator=gen)
        mask = (torch.arange(SEQ).unsqueeze(0) < lengths.unsqueeze(1)).long()
        labels = torch.cat([ids[:, 1:], ids[:, :1]], dim=1).masked_fill(mask == 0, -100)
        batches.append({"input_ids": ids * mask, "attention_mask": mask, "labels": labels})
    return batches


def token_loss(logits, labels):
    """Cross-entropy, the mean over this micro-batch's labelled tokens."""
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)


def make_pipeline(num_stages=2):
    from deepspeed.pipe import PipelineModule
    return PipelineModule(layers=layers(), num_stages=num_stages, loss_fn=token_loss, partition_method="uniform")


def make_pipeline_batches(steps, global_batch_size):
    return [(batch["input_ids"], batch["labels"]) for batch in make_batches(steps, global_batch_size)]
