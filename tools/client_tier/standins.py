# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Tiny random stand-ins for the hub models accelerate's DeepSpeed tests name beyond the client tests' own
make_hub_standins.py (which writes the GPT-2, GPT-J and T5 ones), in the same local hub-cache layout, so
``from_pretrained("<id>")`` resolves with HF_HUB_OFFLINE=1. The tests that load them check how DeepSpeed is
prepared and trained, not the weights. The Llama and the Qwen MoE are the test suite's tiny Llama
(tools/hf_training/tiny_models.py), resized where a test needs it.

tools/client-tier writes them (into HF_HUB_CACHE, else HF_HOME/hub) before its first test.
"""

import os
from pathlib import Path

from hf_training.tiny_models import CONFIGS, from_settings

REVISION = "0" * 40
# accelerate's ALST script feeds token ids up to 228, its test_deepspeed.py the MoE ids up to 1000.
ALST_LLAMA = dict(CONFIGS["llama"], vocab_size=256)
QWEN_MOE = dict(CONFIGS["llama"],
                model_type="qwen2_moe",
                vocab_size=1024,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=32,
                num_experts=4,
                num_experts_per_tok=2)


def hub_cache():
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser() / "hub"


def snapshot(repo_id):
    root = hub_cache() / ("models--" + repo_id.replace("/", "--"))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(REVISION)
    return root / "snapshots" / REVISION


def word_tokenizer(vocab_size):
    """A word-level tokenizer: the ALST script loads one, and its inputs are token ids already."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def standins():
    import transformers as tf

    return {
        # test_deepspeed.py: a GPT-2 to prepare and checkpoint ("gpt2" by name), the config of a model with
        # hidden_sizes (MobileViT, for the comm-buffer autofill), and an MoE model to prepare.
        "gpt2": (lambda: tf.GPT2LMHeadModel(tf.GPT2Config(n_positions=64, n_embd=32, n_layer=2, n_head=2)), None),
        "apple/mobilevit-xx-small": (lambda: tf.MobileViTConfig(hidden_sizes=[16, 24, 32]), None),
        "peft-internal-testing/tiny-random-qwen-1.5-MoE": (lambda: from_settings(QWEN_MOE), None),
        # accelerate's ALST script: a Llama with sdpa attention (what ALST is registered for) and its tokenizer.
        "hf-internal-testing/tiny-random-LlamaForCausalLM":
        (lambda: from_settings(ALST_LLAMA, attn_implementation="sdpa"),
         lambda: word_tokenizer(ALST_LLAMA["vocab_size"])),
    }


def write_standins():
    for repo_id, (model, tokenizer) in standins().items():
        path = snapshot(repo_id)
        model().save_pretrained(path)
        if tokenizer:
            tokenizer().save_pretrained(path)
        print("stand-in written:", repo_id)


if __name__ == "__main__":
    write_standins()
