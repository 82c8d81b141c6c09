# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The training rows: ``STEPS`` global batches of ``GLOBAL_BATCH`` sequences, read in order.

Padded rows have lengths 3..``SEQ_LEN`` (right padding, attention mask 0, labels -100), so a
micro-batch's token mean differs from the global one; unpadded rows are all ``SEQ_LEN`` long.
Position 0's label is -100 everywhere: no row predicts it, so every transformers release counts
the same number of targets (older ones counted it before the label shift).
"""

import torch

from .tiny_models import PAD_TOKEN_ID, VOCAB_SIZE

GLOBAL_BATCH = 8
STEPS = 2
SEQ_LEN = 12


def make_rows(padded, seed=1, steps=STEPS):
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(GLOBAL_BATCH * steps):
        length = int(torch.randint(3, SEQ_LEN + 1, (1, ), generator=gen)) if padded else SEQ_LEN
        input_ids = torch.randint(PAD_TOKEN_ID + 1, VOCAB_SIZE, (SEQ_LEN, ), generator=gen)
        input_ids[length:] = PAD_TOKEN_ID
        attention_mask = (torch.arange(SEQ_LEN) < length).long()
        labels = input_ids.masked_fill(attention_mask == 0, -100)
        labels[0] = -100
        rows.append({"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels})
    return rows


class Rows(torch.utils.data.Dataset):

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]


def step_rows(rows, step):
    """The rows of global batch ``step`` (0-based)."""
    return rows[step * GLOBAL_BATCH:(step + 1) * GLOBAL_BATCH]
