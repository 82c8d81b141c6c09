# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker: the Hugging Face Trainer grid of ``hf_training.cases`` for this launch's world size.

Each case trains the same rows with the Trainer (with or without DeepSpeed) and reports, per step,
the applied gradient's norm, factor and relative error against the fp64 reference and against the
same split without DeepSpeed, the optimizer hook's norm, and what the Trainer logged.
"""

from pathlib import Path

import deepspeed.comm as dist  # noqa: E402
from helpers.rank_cases import run_cases  # noqa: E402
from hf_training import batches, cases, reference, tiny_models, trainer_run  # noqa: E402

LR = 0.5


class Grid:
    """Models, rows and references built once per launch; baselines kept to compare DeepSpeed with."""

    def __init__(self, results_dir):
        self.models_dir = Path(results_dir) / "models"
        self.rows = {padding: batches.make_rows(padded=padding == "padded") for padding in cases.PADDINGS}
        self._saved = set()
        self._references = {}
        self._baselines = {}

    def model_dir(self, model):
        path = self.models_dir / model
        # Every rank takes this branch at the same call (not on path.exists(): rank 0 may be writing).
        if model not in self._saved:
            if dist.get_rank() == 0:
                tiny_models.save_seeded(model, path)
            dist.barrier()
            self._saved.add(model)
        return path

    def reference(self, case):
        key = (case.model, case.padding, case.objective_micro_batch())
        if key not in self._references:
            model = tiny_models.load(self.model_dir(case.model))
            self._references[key] = reference.sgd_reference(model, self.rows[case.padding], LR,
                                                            case.objective_micro_batch())
        return self._references[key]

    def run(self, case):
        ref = self.reference(case)
        got = trainer_run.train_case(self.model_dir(case.model), self.rows[case.padding], case.backend,
                                     case.micro_batch, case.gas, batches.STEPS, LR,
                                     None if case.loss_kwargs == "model" else False)
        factors, errors = cases.compare(got["applied"], [step.grad for step in ref])
        baseline = self._baselines.get(case.baseline)
        if case.backend == "none":
            self._baselines[case] = got["applied"]
        return {
            "accepts_loss_kwargs": got["accepts_loss_kwargs"],
            "reference_norm": [float(step.grad.norm()) for step in ref],
            "applied_norm": [float(g.norm()) for g in got["applied"]],
            "hook_norm": got["hook_norms"],
            "factor": factors,
            "rel_error": errors,
            "rel_error_vs_no_deepspeed": None if baseline is None else cases.compare(got["applied"], baseline)[1],
            "reference_loss": [step.loss for step in ref],
            "logged_loss": got["logged_loss"],
            "logged_grad_norm": got["logged_grad_norm"],
        }

    def objectives_differ(self):
        """How far apart the two objectives' step-1 gradients are, per model and padding: the suite can
        only tell them apart where this is well above its tolerance."""
        out = {}
        for model, padding in ((m, p) for m in cases.MODELS for p in cases.PADDINGS):
            loaded = [tiny_models.load(self.model_dir(model)) for _ in range(2)]
            token_mean = reference.sgd_reference(loaded[0], self.rows[padding], LR, None)[0].grad
            mean_of_means = reference.sgd_reference(loaded[1], self.rows[padding], LR, 1)[0].grad
            out[f"{model}-{padding}"] = float((token_mean - mean_of_means).norm() / token_mean.norm())
        return out


def main():
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--results-dir", required=True)
    parser.add_argument("--world-size", type=int, required=True)
    args, _ = parser.parse_known_args()
    grid = Grid(args.results_dir)
    named = {"objectives_differ": grid.objectives_differ}
    for case in cases.grid(args.world_size):
        named[case.name] = (lambda case=case: grid.run(case))
    run_cases(named)


if __name__ == "__main__":
    main()
