# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""``--hf-model DIR``: a local Hugging Face causal LM and synthetic token batches of variable lengths.

Nothing is fetched from a hub: DIR holds a config (``config.json``) and, optionally, weights; without
weights the model is built from the config under the checker's seed. Dropout is set to 0 (the check
compares runs that must see the same function). Each sample has a random length; the rest is padding,
masked in ``attention_mask`` and left out of the loss (label -100), so the loss the model computes is
the mean over the micro-batch's real tokens.
"""

from pathlib import Path

import torch

# Config fields that hold a dropout probability in transformers' model configs.
DROPOUT_FIELDS = ("attention_dropout", "hidden_dropout", "dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop",
                  "hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def _config(directory):
    path = Path(directory)
    if not (path / "config.json").is_file():
        raise ValueError(f"--hf-model {directory}: no config.json there (a local model directory is expected; "
                         "nothing is downloaded)")
    try:
        from transformers import AutoConfig
    except ImportError:
        raise ValueError("--hf-model needs transformers: pip install 'deepspeed[hf]'") from None
    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    for field in DROPOUT_FIELDS:
        if isinstance(getattr(config, field, None), float):
            setattr(config, field, 0.0)
    return config


def model_factory(directory):
    """A no-argument factory for the model in ``directory`` (fp32, eager attention, dropout 0)."""
    config = _config(directory)
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging
    logging.disable_progress_bar()  # one bar per rank per split would bury the check's own output
    has_weights = any((Path(directory) / name).is_file() for name in WEIGHT_FILES)

    def make_model():
        if has_weights:
            return AutoModelForCausalLM.from_pretrained(str(directory),
                                                        config=config,
                                                        local_files_only=True,
                                                        dtype=torch.float32,
                                                        attn_implementation="eager")
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")

    make_model.has_weights = has_weights
    return make_model


def token_batches(directory, steps, global_batch_size, seq_len=16, min_len=4, seed=4321):
    """``steps`` dicts of input_ids / attention_mask / labels, each sample 4..seq_len real tokens."""
    vocab = _config(directory).vocab_size
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        ids = torch.randint(0, vocab, (global_batch_size, seq_len), generator=gen)
        lengths = torch.randint(min_len, seq_len + 1, (global_batch_size, ), generator=gen)
        mask = (torch.arange(seq_len).unsqueeze(0) < lengths.unsqueeze(1)).long()
        labels = ids.masked_fill(mask == 0, -100)
        batches.append({"input_ids": ids * mask, "attention_mask": mask, "labels": labels})
    return batches
