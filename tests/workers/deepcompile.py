# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker (1 or 2 ranks): DeepCompile's ZeRO-1, ZeRO-2 and ZeRO-3 passes (``compile.deepcompile``), the engine
compiled with ``engine.compile()`` before it trains, two SGD steps of one global batch of 4 per rank at micro-batch
x GAS 4x1, 2x2 and 1x4, against fp64 on the whole batch: the reported grad norm and the update of the fp32 master
weights.

DeepCompile's native op (CUDA streams and NCCL) runs as ``helpers.deepcompile_standin``: its bookkeeping in torch,
reduced through the process group; the rest is DeepCompile's own Python (the engine's hooks, the backend, the passes
that put the reductions into the compiled backward, the profiler) and the ZeRO optimizer's step. Case names
``<path>[_native_0_19_8]_m<micro>_g<gas>``: ``native_0_19_8`` runs the stand-in as 0.19.8's native op, which
flushes an emptied bucket (where the native build aborts, the case reports the assertion); ``eager_head``: the last
layer runs eagerly (``torch.compiler.disable``), outside DeepCompile's compiled backward; ``no_accumulation`` (a
control): the stand-in's ZeRO-3 reduction overwrites the gradients of the step's earlier micro-batches;
``gas_check_zero<stage>_m4_g4``: ds_gas_check's own check of ``tools/gpu-check``'s DeepCompile config (4x4 in its
config; the check trains its default splits; the fork only). With
DS_TEST_DEEPCOMPILE_NATIVE set (``tools/gpu-check``, one GPU) the native op itself runs.
"""

import os

import torch  # noqa: E402

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
from helpers import deepcompile_standin  # noqa: E402
from helpers.engine_paths import BF16, reference_sgd_step, relative_update_error  # noqa: E402
from helpers.master_weights import zero_master_weights  # noqa: E402
from helpers.rank_cases import run_cases  # noqa: E402
from helpers.small_model import global_batch, make_layers, micro_batches, mse, rank_share, sgd_config  # noqa: E402

NATIVE = "DS_TEST_DEEPCOMPILE_NATIVE"  # set on a GPU: DeepCompile's own native op, no stand-in
PER_RANK, STEPS, LR, CLIP = 4, 2, 0.1, 0.5
SPLITS = [(4, 1), (2, 2), (1, 4)]
PATHS = {  # path -> (ZeRO stage, extra config, clip)
    "zero1_fp32": (1, {}, 0.0),
    "zero1_bf16_clip": (1, BF16, CLIP),
    "zero2_fp32_clip": (2, {}, CLIP),
    "zero2_bf16": (2, BF16, 0.0),
    "zero3_fp32": (3, {}, 0.0),
    "zero3_bf16_clip": (3, BF16, CLIP),
}


class Model(torch.nn.Sequential):
    """The small MLP with a forward of its own: torch.compile compiles a model's own forward (a plain Sequential of
    torch's layers runs eager)."""

    def forward(self, x):
        for layer in self:
            x = layer(x)
        return x


class Eager(torch.nn.Module):
    """A layer whose forward torch.compile leaves to run eagerly (``torch.compiler.disable``)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    @torch.compiler.disable
    def forward(self, x):
        return self.layer(x)


def reference_training(inputs, targets, clip):
    """fp64 on the whole batch: per step the norm of the mean loss's gradient, and the weights after the steps."""
    model = Model(*make_layers()).double()
    norms = []
    for step in range(STEPS):
        model.zero_grad()
        mse(model(inputs[step].double()), targets[step].double()).backward()
        norms.append(reference_sgd_step(model.parameters(), LR, clip if clip > 0 else float("inf")))
    return norms, {name: p.detach().clone() for name, p in model.named_parameters()}


def case(path, micro, gas, native_0_19_8=False, eager_head=False, accumulate=True):

    def run():
        stage, extra, clip = PATHS[path]
        if not os.environ.get(NATIVE):
            deepcompile_standin.install(flush_empty_skipped=not native_0_19_8, accumulate=accumulate)
        ranks, rank = dist.get_world_size(), dist.get_rank()
        batches = [global_batch(PER_RANK * ranks, seed=4321 + step) for step in range(STEPS)]
        config = dict(sgd_config(micro, gas, clip, LR),
                      zero_optimization={"stage": stage},
                      compile={"deepcompile": True},
                      **extra)
        layers = make_layers()
        model = Model(*layers[:-1], Eager(layers[-1])) if eager_head else Model(*layers)
        before = {name.replace("layer.", ""): p.detach().double().clone() for name, p in model.named_parameters()}
        engine = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)[0]
        engine.compile()
        dtype = next(engine.module.parameters()).dtype
        norms = []
        try:
            for inputs, targets in batches:
                for x, y in micro_batches(*rank_share(inputs, targets, rank, PER_RANK), micro, gas, dtype):
                    engine.backward(mse(engine(x), y))
                    engine.step()
                norm = engine.get_global_grad_norm()
                norms.append(None if norm is None else float(norm))
        except deepcompile_standin.NativeAssertion as err:
            engine.destroy()
            return {"aborted": str(err), "optimizer_steps": len(norms)}
        # The fork's refusal of a gradient the step would leave out (patch
        # Refuse-gradients-DeepCompile-s-ZeRO-1-2-backward-wou).
        except RuntimeError as err:
            engine.destroy()
            return {"refused": str(err), "optimizer_steps": len(norms)}
        after = {name.replace("layer.", ""): value for name, value in zero_master_weights(engine).items()}
        engine.destroy()
        reference_norms, expected = reference_training([b[0] for b in batches], [b[1] for b in batches], clip)
        names = sorted(expected)
        return {
            "norms": norms,
            "reference_norms": reference_norms,
            "update_error": relative_update_error(*([d[n] for n in names] for d in (after, expected, before))),
        }

    return run


def gas_check_case(stage):
    """``ds_gas_check``'s own check (``check_gas_invariance``, the engine compiled) of the DeepCompile config that
    ``tools/gpu-check`` gives it on a GPU (bf16, Adam, clipping below the norm), at its default splits."""

    def run():
        from deepspeed.gafix.gas_check import check_gas_invariance
        from helpers.repo import load_script
        if not os.environ.get(NATIVE):
            deepcompile_standin.install()
        config = load_script("tools/gpu_check.py").deepcompile(stage)
        return [{
            "split": result.name,
            "verdict": result.verdict,
            "norm_error": result.norm_error,
            "update_error": max(result.update_errors),
            "tolerance": result.tolerance,
        } for result in check_gas_invariance(config, compiled=True)]

    return run


if __name__ == "__main__":
    cases = {f"{p}_m{m}_g{g}": case(p, m, g) for p in PATHS for m, g in SPLITS}
    cases.update({f"zero1_fp32_native_0_19_8_m{m}_g{g}": case("zero1_fp32", m, g, True) for m, g in SPLITS})
    cases.update({f"{p}_eager_head_m2_g2": case(p, 2, 2, eager_head=True) for p in ("zero1_fp32", "zero2_fp32_clip")})
    cases.update({f"gas_check_zero{stage}_m4_g4": gas_check_case(stage) for stage in (1, 3)})
    if not os.environ.get(NATIVE):  # a control of the stand-in's: its ZeRO-3 reduction keeps only the last micro-batch
        cases.update({
            f"zero3_fp32_no_accumulation_m{m}_g{g}": case("zero3_fp32", m, g, accumulate=False)
            for m, g in SPLITS
        })
    run_cases(cases)
