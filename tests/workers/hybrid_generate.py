# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker: RLHF's loop on the hybrid engine (``"hybrid_engine": {"enabled": true}``), generation between
training steps, against fp64 PyTorch: each step generates from a prompt (greedy, 3 new tokens), then trains one
global batch of 8 at a micro-batch x GAS split of the rank's 4 samples.

The model is the tests' tiny Hugging Face ``MistralForCausalLM`` (``hf_training.tiny_models``), which no DeepSpeed
inference policy matches: the engine generates on the model's own path (patch
Let-the-hybrid-engine-generate-on-a-model-s-own-path), its ZeRO-3 partitions gathered for it. Each case reports whether
every step's tokens equal what the fp64 reference's weights of that step generate in the engine's dtype, and, after 2
steps, the grad norm and the weights against the reference's (SGD, clipping below the norm). Variants:

- ``zero3_fp32``: ZeRO-3, the hybrid engine's defaults (``pin_parameters``: every layer gathered at once).
- ``zero3_fp32_unpinned``: ``pin_parameters`` false (ZeRO-3 fetches each layer as it runs).
- ``zero3_fp32_release_cache``: ``release_inference_cache`` (the workspace released after each generation).
- ``zero3_fp32_inference_tp2``: ``inference_tp_size`` 2, ``tp_gather_partition_size`` 1: the 2 ranks generate as
  one group, their prompts gathered (each rank's own prompt), each rank given back its own rows.
- ``zero2_bf16``: ZeRO-2 in bf16 (nothing to gather).

Case names ``<variant>_m<micro>_g<gas>``.
"""

import copy

import torch  # noqa: E402

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
from hf_training import tiny_models  # noqa: E402
from helpers.autoep_hf_model import VOCAB, causal_lm_loss, global_batch  # noqa: E402
from helpers.engine_paths import BF16, reference_sgd_step, relative_update_error  # noqa: E402
from helpers.master_weights import zero_master_weights  # noqa: E402
from helpers.rank_cases import run_cases  # noqa: E402
from helpers.small_model import sgd_config  # noqa: E402

GLOBAL_BATCH, STEPS, NEW_TOKENS = 8, 2, 3
LR, CLIP = 0.5, 1.0
SPLITS = [(4, 1), (2, 2), (1, 4)]
# variant -> (ZeRO stage, hybrid_engine settings, extra config)
VARIANTS = {
    "zero3_fp32": (3, {}, {}),
    "zero3_fp32_unpinned": (3, {
        "pin_parameters": False
    }, {}),
    "zero3_fp32_release_cache": (3, {
        "release_inference_cache": True
    }, {}),
    "zero3_fp32_inference_tp2": (3, {
        "inference_tp_size": 2,
        "tp_gather_partition_size": 1
    }, {}),
    "zero2_bf16": (2, {}, BF16),
}


def mistral_causal_lm():
    return tiny_models.from_settings(tiny_models.CONFIGS["mistral"])


def config(variant, micro, gas):
    stage, hybrid, extra = VARIANTS[variant]
    return {
        **sgd_config(micro, gas, CLIP, LR),
        "zero_optimization": {
            "stage": stage
        },
        "hybrid_engine": {
            "enabled": True,
            **hybrid
        },
        **extra,
    }


def greedy(generate, prompt):
    """Greedy generation of NEW_TOKENS. No attention mask is passed: with ``inference_tp_size`` the engine gathers the
    group's token ids alone (a mask beside them would not match their rows); the prompts hold no padding token (0), so
    the one generate infers is every position."""
    return generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)


def case(variant, micro, gas):

    def run():
        engine, *_ = deepspeed.initialize(model=mistral_causal_lm(), config=config(variant, micro, gas))
        assert type(engine).__name__ == "DeepSpeedHybridEngine"
        dtype = next(engine.module.parameters()).dtype
        reference = mistral_causal_lm().double()
        with torch.no_grad():  # the weights the engine trains, rounded to its dtype
            for param in reference.parameters():
                param.copy_(param.to(dtype))
        before = {name: param.detach().clone() for name, param in reference.named_parameters()}
        inputs, labels = global_batch(GLOBAL_BATCH)
        rank, world = dist.get_rank(), dist.get_world_size()
        per_rank = GLOBAL_BATCH // world
        prompt = torch.randint(1, VOCAB, (2, 4), generator=torch.Generator().manual_seed(100 + rank))
        generations_match, reference_norm = [], None
        for step in range(STEPS):
            engine.eval()
            generated = greedy(engine.generate, prompt.to(engine.device))
            engine.train()
            # The reference's weights in the engine's dtype: the same greedy tokens unless a weight differs.
            generator = copy.deepcopy(reference).to(dtype).eval()
            with torch.no_grad():
                expected = greedy(generator.generate, prompt)
            generations_match.append(torch.equal(generated.cpu(), expected))

            mine = slice(rank * per_rank, (rank + 1) * per_rank)
            for i in range(gas):
                batch = slice(i * micro, (i + 1) * micro)
                loss = causal_lm_loss(engine, inputs[mine][batch].to(engine.device),
                                      labels[mine][batch].to(engine.device))
                engine.backward(loss)
                engine.step()
            reference.zero_grad()
            causal_lm_loss(reference, inputs, labels).backward()
            reference_norm = reference_sgd_step(reference.parameters(), LR, CLIP)
        norm = engine.get_global_grad_norm()
        trained = zero_master_weights(engine)
        engine.destroy()
        expected = {name: param.detach() for name, param in reference.named_parameters()}
        names = sorted(trained)
        return {
            "generations_match": generations_match,
            "norm": None if norm is None else float(norm),
            "reference_norm": reference_norm,
            "update_error": relative_update_error(*([d[n] for n in names] for d in (trained, expected, before))),
        }

    return run


if __name__ == "__main__":
    run_cases({f"{v}_m{m}_g{g}": case(v, m, g) for v in VARIANTS for m, g in SPLITS})
