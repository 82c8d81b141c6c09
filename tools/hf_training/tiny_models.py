# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Tiny causal LMs built from config (no hub download), seeded once and saved, reloaded per case."""

from pathlib import Path

import torch

VOCAB_SIZE = 96
PAD_TOKEN_ID = 0

# Both: 2 layers, 4 query / 2 key-value heads of 8. Llama: untied head; Qwen3: tied head (as
# Qwen3's small checkpoints), q/k norms.
_SHARED = dict(vocab_size=VOCAB_SIZE,
               hidden_size=32,
               intermediate_size=64,
               num_hidden_layers=2,
               num_attention_heads=4,
               num_key_value_heads=2,
               max_position_embeddings=64,
               pad_token_id=PAD_TOKEN_ID)
CONFIGS = {
    "llama": dict(_SHARED, model_type="llama", tie_word_embeddings=False),
    "qwen3": dict(_SHARED, model_type="qwen3", head_dim=8, tie_word_embeddings=True),
    # No DeepSpeed inference policy matches Mistral: the hybrid engine generates on the model's own path.
    "mistral": dict(_SHARED, model_type="mistral", head_dim=8, tie_word_embeddings=False),
}


def from_settings(settings, seed=0, attn_implementation="eager"):
    """A causal LM initialised with ``seed`` from config ``settings`` (one of CONFIGS, or one made from it)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    settings = dict(settings)
    config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)


def save_seeded(model_name, directory, seed=0):
    """Initialise ``model_name`` from its config with ``seed`` and save it to ``directory``."""
    from_settings(CONFIGS[model_name], seed).save_pretrained(directory)


def saved_once(model_name, root):
    """``root``/model: ``model_name`` seeded and saved there by rank 0 of the first launch, read by every rank after."""
    import deepspeed.comm as dist
    path = Path(root) / "model"
    if dist.get_rank() == 0 and not path.exists():
        save_seeded(model_name, path)
    dist.barrier()
    return path


def load(directory, dtype=torch.float32):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, attn_implementation="eager")
