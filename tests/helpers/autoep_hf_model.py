# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""A tiny Hugging Face ``MixtralForCausalLM``, as a user hands it to AutoEP, and its fp64 reference.

Two decoder layers, each with attention, RMSNorms and a Mixtral MoE block (4 experts, top 2), between an
embedding and an untied LM head: the model AutoEP's ``mixtral`` preset is made for, where
``autoep_model.MixtralNet`` has the MoE block alone. Eager attention and eager experts (Transformers' grouped
experts refuse fp64). No router logits are returned, so the loss has no auxiliary load-balancing term: that
term is not a mean over samples (it multiplies two batch means), so no split of a batch would leave it
unchanged. Every position is labelled, so each micro-batch's causal-LM loss is a mean over the same number
of tokens and the mean of micro-batch losses is the global token mean.
"""

import torch

VOCAB, TOKENS, LAYERS = 32, 6, 2


def mixtral_config():
    import transformers
    return transformers.MixtralConfig(vocab_size=VOCAB,
                                      hidden_size=16,
                                      intermediate_size=24,
                                      num_hidden_layers=LAYERS,
                                      num_attention_heads=2,
                                      num_key_value_heads=1,
                                      head_dim=8,
                                      num_local_experts=4,
                                      num_experts_per_tok=2,
                                      max_position_embeddings=32,
                                      router_jitter_noise=0.0,
                                      initializer_range=0.2,
                                      tie_word_embeddings=False,
                                      attn_implementation="eager",
                                      experts_implementation="eager")


def mixtral_causal_lm(seed=0):
    import transformers
    torch.manual_seed(seed)
    return transformers.MixtralForCausalLM(mixtral_config())


def let_autoep_read_the_output_capture_registry():
    """DeepSpeed 0.19.8's AutoEP retargets Transformers' router-logit recorders through the registry
    ``transformers.utils.output_capturing._CAN_RECORD_REGISTRY`` as a plain dict (``get(key, default)``,
    ``registry[key] = entry``, keys the model classes' names). Transformers 5.23's registry is a dict whose ``get`` and
    ``__setitem__`` take a model instead, so ``deepspeed.initialize`` of any Mixtral with AutoEP raises ``TypeError:
    _CanRecordRegistry.get() takes 2 positional arguments but 3 were given`` on 0.19.8 (upstream's own
    ``test_hf_mixtral_causal_lm_matches_autoep_with_router_logits`` does too; the fork reads the registry by key since
    patch Read-and-restore-AutoEP-s-output-capture-registry-en). Give string keys a plain dict's behaviour back, for
    this process, so that the same cases run on 0.19.8; model keys keep Transformers'. The recorders are not what the
    tests here check (they return no router logits)."""
    try:
        from transformers.utils import output_capturing
    except ImportError:  # a Transformers without the registry: AutoEP does not retarget recorders then
        return
    registry_type = type(getattr(output_capturing, "_CAN_RECORD_REGISTRY", None))
    if registry_type is dict or getattr(registry_type, "_string_keys_as_a_dict", False):
        return
    model_get, model_setitem = registry_type.get, registry_type.__setitem__

    def get(self, key, *default):
        return dict.get(self, key, *default) if isinstance(key, str) else model_get(self, key)

    def setitem(self, key, value):
        return dict.__setitem__(self, key, value) if isinstance(key, str) else model_setitem(self, key, value)

    registry_type.get, registry_type.__setitem__, registry_type._string_keys_as_a_dict = get, setitem, True


def global_batch(size, seed=4321):
    """Token ids and labels (independent of the ids, so every sample has its own gradient)."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, VOCAB, (size, TOKENS), generator=gen)
    return input_ids, torch.randint(0, VOCAB, (size, TOKENS), generator=gen)


def causal_lm_loss(module, input_ids, labels):
    return module(input_ids=input_ids, labels=labels).loss


def fp64_gradients(weights, inputs, targets):
    """The fp64 gradients of the causal-LM loss over the whole batch, of the unconverted model holding
    ``weights`` (``autoep_model.original_layout``'s names), by name."""
    reference = mixtral_causal_lm().double()
    reference.load_state_dict(weights)
    causal_lm_loss(reference, inputs, targets).backward()
    return {name: param.grad for name, param in reference.named_parameters()}
