# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What every case must apply: plain PyTorch SGD in fp64 on the same rows, no DeepSpeed, no Trainer.

Two objectives per global batch (sum of token cross-entropies of shifted labels, as the causal LM
loss takes them):
- ``token_mean``: over all the batch's targets at once, what the Trainer computes when the model
  accepts loss kwargs (``num_items_in_batch``), whatever the split;
- ``mean_of_means``: the mean over micro-batches of each micro-batch's own token mean, what a model
  that returns its own mean loss gives under gradient accumulation (equal when every micro-batch
  holds the same number of targets).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .batches import STEPS, step_rows


@dataclass
class ReferenceStep:
    loss: float
    grad: torch.Tensor  # flat fp64 gradient, in model.parameters() order


def token_sums(model, rows):
    """Per row: (sum of target cross-entropies, number of targets)."""
    sums = []
    for row in rows:
        logits = model(input_ids=row["input_ids"][None], attention_mask=row["attention_mask"][None]).logits[0]
        targets = row["labels"][1:]
        loss = F.cross_entropy(logits[:-1].double(), targets, ignore_index=-100, reduction="sum")
        sums.append((loss, int(targets.ne(-100).sum())))
    return sums


def objective(sums, micro_batch):
    """``micro_batch`` None: token_mean over every row; else mean_of_means over chunks of that many rows."""
    if micro_batch is None:
        return sum(loss for loss, _ in sums) / sum(count for _, count in sums)
    chunks = [sums[i:i + micro_batch] for i in range(0, len(sums), micro_batch)]
    means = [sum(loss for loss, _ in chunk) / sum(count for _, count in chunk) for chunk in chunks]
    return sum(means) / len(means)


def sgd_reference(model, rows, lr, micro_batch=None):
    """Train a copy of ``model`` (fp64) for STEPS steps of SGD; return one ReferenceStep per step."""
    model = model.double()
    params = list(model.parameters())
    steps = []
    for step in range(STEPS):
        model.zero_grad(set_to_none=True)
        loss = objective(token_sums(model, step_rows(rows, step)), micro_batch)
        loss.backward()
        # Tied weights are one Parameter: parameters() yields it once, with the summed gradient.
        grad = torch.cat([p.grad.flatten() for p in params])
        steps.append(ReferenceStep(loss=float(loss), grad=grad))
        with torch.no_grad():
            for p in params:
                p -= lr * p.grad
    return steps
