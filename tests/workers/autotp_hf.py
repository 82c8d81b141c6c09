# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker: AutoTP sharding a Hugging Face model from the config alone (``tensor_parallel``), against fp64 PyTorch
on the unsharded model: the grad norm and the weights after one step of a global batch of 8 at every micro-batch x
GAS split, on 2 ranks (tensor parallel 2, data parallel 1).

The models are the tests' tiny causal LMs (``hf_training.tiny_models``: Llama with an untied head, Qwen3 with its
head tied to the embedding). Layouts, each a way a user asks AutoTP to shard:

- ``llama_preset``: ``preset_model`` "llama" (attention's q/k/v and the MLP's gate/up column-parallel, o and down
  row-parallel).
- ``llama_partition_config``: the same sharding written as ``partition_config`` rules (regular expressions, no
  default specs), with ``tp_grain_size`` 8.
- ``llama_hf_tp_plan``: neither: AutoTP follows the model's own ``base_model_tp_plan`` from transformers.
- ``llama_vocab_head``: ``preset_model`` "llama" and ``vocab_parallel_lm_head``: the LM head split over the
  vocabulary, the loss over the split logits.
- ``llama_tp_model_init``: ``preset_model`` "llama", the model passed first through ``deepspeed.tp_model_init`` with
  the user's own tensor-parallel group (``tp.tp_group``) and dtype (``tensor_parallel.dtype``); 0.19.8 fails it on rank
  0 and leaves rank 1 waiting (patch Print-a-config-that-holds-a-process-group-instead-of): against 0.19.8, leave it
  out of the launch.
- ``qwen3_tied_head``: ``preset_model`` "qwen3" on a head tied to the embedding (AutoTP chooses the vocabulary-
  parallel head itself), ``keep_module_on_host``.
- ``llama_heuristic``: a Llama without a transformers tp_plan and no preset or rules: AutoTP's own parser finds the
  layers (the path ``kernel_inject`` and ``injection_policy_tuple`` are read on), with ``kernel_inject`` true, an
  ``injection_policy_tuple`` naming the LM head and a user's ``tp.mpu``: training shards by the parser's policy,
  injects no kernel and takes its groups from DeepSpeed's own.
- ``llama_vocab_head_liger``: ``llama_vocab_head`` with ``vocab_parallel_ce_backend`` "liger": on a CPU (no Triton)
  the engine warns and computes the PyTorch loss.

Weights are compared gathered (``GatherReplacedLayerParams``). Case names ``<layout>_<path>_m<micro>_g<gas>``.
"""

import torch  # noqa: E402

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
from hf_training import tiny_models  # noqa: E402
from helpers.autoep_hf_model import causal_lm_loss, global_batch  # noqa: E402
from helpers.engine_paths import BF16, reference_sgd_step, relative_update_error  # noqa: E402
from helpers.rank_cases import run_cases  # noqa: E402
from helpers.small_model import sgd_config  # noqa: E402

GLOBAL_BATCH, TP = 8, 2
LR, CLIP = 0.5, 1.0
SPLITS = [(8, 1), (4, 2), (2, 4)]
PATHS = {"zero0_fp32": (0, {}), "zero1_fp32": (1, {}), "zero2_bf16": (2, BF16)}  # path -> (ZeRO stage, extra config)
DTYPES = {"zero0_fp32": torch.float32, "zero1_fp32": torch.float32, "zero2_bf16": torch.bfloat16}
COLUMN = ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"]
ROW = ["o_proj", "down_proj"]
PARTITION_CONFIG = {
    "use_default_specs":
    False,
    "layer_specs": [{
        "patterns": [f".*\\.{name}\\.weight$" for name in COLUMN],
        "partition_type": "column"
    }, {
        "patterns": [f".*\\.{name}\\.weight$" for name in ROW],
        "partition_type": "row"
    }],
}
# layout -> (model, tensor_parallel settings besides autotp_size)
LAYOUTS = {
    "llama_preset": ("llama", {
        "preset_model": "llama"
    }),
    "llama_partition_config": ("llama", {
        "partition_config": PARTITION_CONFIG,
        "tp": {
            "tp_grain_size": 8
        }
    }),
    "llama_hf_tp_plan": ("llama", {}),
    "llama_vocab_head": ("llama", {
        "preset_model": "llama",
        "vocab_parallel_lm_head": True
    }),
    "llama_tp_model_init": ("llama", {
        "preset_model": "llama"
    }),
    "qwen3_tied_head": ("qwen3", {
        "preset_model": "qwen3",
        "keep_module_on_host": True
    }),
    "llama_heuristic": (
        "llama",
        {
            "kernel_inject": True,
            "injection_policy_tuple": ["lm_head"],  # not what the parser finds: replaced
        }),
    "llama_vocab_head_liger": ("llama", {
        "preset_model": "llama",
        "vocab_parallel_lm_head": True,
        "vocab_parallel_ce_backend": "liger"
    }),
}


class GroupsMpu:
    """A Megatron-style mpu over DeepSpeed's own groups, as a user passes one (``tp.mpu``)."""

    def __getattr__(self, name):
        from deepspeed.utils import groups
        return getattr(groups, f"_get_{name[len('get_'):]}") if name.startswith("get_") else getattr(groups, name)


def without_tp_plan(model):
    """``model`` with no transformers tp_plan (config, class or instance), as a model that ships none."""
    model.config.base_model_tp_plan = None
    model.__dict__.pop("_tp_plan", None)
    model.__class__ = type(f"{type(model).__name__}WithoutTpPlan", (type(model), ), {"_tp_plan": None})
    return model


def config(layout, path, micro, gas):
    stage, extra = PATHS[path]
    settings = dict(LAYOUTS[layout][1])
    if layout == "llama_heuristic":
        settings["tp"] = {"mpu": GroupsMpu()}
    return {
        **sgd_config(micro, gas, CLIP, LR),
        "zero_optimization": {
            "stage": stage
        },
        "tensor_parallel": {
            "autotp_size": TP,
            **settings
        },
        **extra,
    }


def gathered_weights(engine):
    """{name: the whole parameter} in fp64: the fp32 master weights where ZeRO keeps them linked, else the module's
    own; AutoTP's shards gathered."""
    from deepspeed.module_inject.layers import GatherReplacedLayerParams
    from deepspeed.utils import safe_get_full_fp32_param
    weights = {}
    for module_name, module in engine.module.named_modules():
        params = list(module.named_parameters(recurse=False))
        if not params:
            continue
        masters = {name: safe_get_full_fp32_param(param) for name, param in params}
        with torch.no_grad():
            for name, param in params:  # the master weights into the parameters (the engine is done), gathered so
                if masters[name] is not None:
                    param.data = masters[name].clone()
            with GatherReplacedLayerParams([p for _, p in params], module, enabled=True):
                for name, param in params:
                    weights[f"{module_name}.{name}"] = param.detach().to("cpu", torch.float64).clone()
    return weights


def case(layout, path, micro, gas):

    def run():
        model = tiny_models.from_settings(tiny_models.CONFIGS[LAYOUTS[layout][0]])
        if layout == "llama_heuristic":
            model = without_tp_plan(model)
        if layout == "llama_tp_model_init":
            # The legacy entry point, with the user's own tensor-parallel group (every rank creates it). It records
            # its arguments for every later initialize of the process: forgotten after this case's.
            from deepspeed.runtime.tensor_parallel import init_utils
            group = dist.new_group(list(range(TP)))
            deepspeed.tp_model_init(model, tp_size=TP, dtype=DTYPES[path], tp_group=group)
        reference = tiny_models.from_settings(tiny_models.CONFIGS[LAYOUTS[layout][0]]).double()
        try:
            engine, *_ = deepspeed.initialize(model=model,
                                              model_parameters=model.parameters(),
                                              config=config(layout, path, micro, gas))
        finally:
            if layout == "llama_tp_model_init":
                init_utils._TP_MODEL_INIT_ARGS = None
        split = [n for n, p in engine.module.named_parameters() if p.shape != reference.get_parameter(n).shape]
        # AutoTP's parser sets the policy of the layers it finds in place of the config's (on the heuristic path)
        policy = engine._config.tensor_parallel_config.injection_policy_tuple
        dtype = next(engine.module.parameters()).dtype
        with torch.no_grad():  # the reference starts from the weights the engine holds (rounded to its dtype)
            for param in reference.parameters():
                param.copy_(param.to(dtype))
        before = {name: param.detach().clone() for name, param in reference.named_parameters()}
        inputs, labels = global_batch(GLOBAL_BATCH)  # every TP rank the same samples
        for i in range(gas):
            batch = slice(i * micro, (i + 1) * micro)
            engine.backward(causal_lm_loss(engine, inputs[batch].to(engine.device), labels[batch].to(engine.device)))
            engine.step()
        norm = engine.get_global_grad_norm()
        causal_lm_loss(reference, inputs, labels).backward()
        reference_norm = reference_sgd_step(reference.parameters(), LR, CLIP)
        expected = {name: param.detach() for name, param in reference.named_parameters()}
        after = gathered_weights(engine)
        engine.destroy()
        names = sorted(expected)
        missing = [n for n in names if n not in after]
        assert not missing, f"parameters the engine lost: {missing}"
        return {
            "split_parameters": len(split),
            "injection_policy": None if policy is None else list(policy),
            "norm": None if norm is None else float(norm),
            "reference_norm": reference_norm,
            "update_error": relative_update_error(*([d[n] for n in names] for d in (after, expected, before))),
        }

    return run


if __name__ == "__main__":
    run_cases({f"{lay}_{p}_m{m}_g{g}": case(lay, p, m, g) for lay in LAYOUTS for p in PATHS for m, g in SPLITS})
