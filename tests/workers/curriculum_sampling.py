# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker: curriculum data sampling (``data_efficiency.data_sampling.curriculum_learning``), the engine's own
data loader choosing each global batch, at several splits of the batch (micro-batch x GAS x 2 ranks).

A dataset of 48 samples of the small MLP, each with a difficulty (a value-based metric: sample ``i`` has difficulty
``1 + i % 3``), written as the index files DeepSpeed's data analyzer writes (``index_to_sample``: the samples of each
difficulty; ``index_to_metric``: the difficulties). The schedule (``fixed_discrete``) allows difficulty 1 at step 1,
2 at step 2, 3 after. Each case trains 3 steps of a global batch of 8 through ``deepspeed.initialize``'s
``training_data`` loader and reports the samples of each step's global batch (gathered from every rank), the
hardest of them, and the weights against an fp64 reference trained on the same global batches (SGD, clipping below
the norm). Case names ``<path>_m<micro>_g<gas>``.
"""

import tempfile

import numpy as np  # noqa: E402
import torch  # noqa: E402

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
from helpers.engine_paths import reference_sgd_step, relative_update_error  # noqa: E402
from helpers.master_weights import zero_master_weights  # noqa: E402
from helpers.rank_cases import run_cases  # noqa: E402
from helpers.small_model import global_batch, make_layers, mse, sgd_config  # noqa: E402

SAMPLES, GLOBAL_BATCH, STEPS = 48, 8, 3
LR, CLIP = 0.1, 0.5
SPLITS = [(4, 1), (2, 2), (1, 4)]
PATHS = {"zero1_fp32": 1, "zero3_fp32": 3}  # path -> ZeRO stage
DIFFICULTIES, MAX_STEPS = [1, 2, 3], [1, 2]  # fixed_discrete: difficulty 1 up to step 1, 2 up to step 2, then 3


def difficulty(sample):
    return 1 + sample % 3


class Samples(torch.utils.data.Dataset):
    """(inputs, target, index) of each sample: the index tells which samples a micro-batch held."""

    def __init__(self):
        self.inputs, self.targets = global_batch(SAMPLES)

    def __len__(self):
        return SAMPLES

    def __getitem__(self, index):
        return self.inputs[index], self.targets[index], index


def write_metric_index(directory):
    """The data analyzer's two index files for the difficulty metric, under ``directory``; their path prefixes."""
    from deepspeed.runtime.data_pipeline.data_sampling.utils import (close_mmap_dataset_builder,
                                                                     create_mmap_dataset_builder)
    to_sample, to_metric = f"{directory}/index_to_sample", f"{directory}/index_to_metric"
    samples, metrics = create_mmap_dataset_builder(to_sample,
                                                   np.int64), create_mmap_dataset_builder(to_metric, np.int64)
    for value in DIFFICULTIES:
        samples.add_item_numpy(np.array([i for i in range(SAMPLES) if difficulty(i) == value], dtype=np.int64))
        metrics.add_item_numpy(np.array([value], dtype=np.int64))
    close_mmap_dataset_builder(samples, to_sample)
    close_mmap_dataset_builder(metrics, to_metric)
    return to_sample, to_metric


def config(path, micro, gas, directory):
    to_sample, to_metric = write_metric_index(directory)
    return {
        **sgd_config(micro, gas, CLIP, LR), "zero_optimization": {
            "stage": PATHS[path]
        },
        "data_efficiency": {
            "enabled": True,
            "seed": 1234,
            "data_sampling": {
                "enabled": True,
                "num_workers": 0,
                "curriculum_learning": {
                    "enabled": True,
                    "data_cluster_path": f"{directory}/clusters",
                    "curriculum_metrics": {
                        "difficulty": {
                            "index_to_sample_path": to_sample,
                            "index_to_metric_path": to_metric,
                            "difficulty_type": "value",
                            "clustering_type": "schedule_based",
                            "min_difficulty": DIFFICULTIES[0],
                            "max_difficulty": DIFFICULTIES[-1],
                            "schedule_type": "fixed_discrete",
                            "schedule_config": {
                                "difficulty": DIFFICULTIES,
                                "max_step": MAX_STEPS
                            }
                        }
                    }
                }
            }
        }
    }


def case(path, micro, gas):

    def run():
        with tempfile.TemporaryDirectory() as directory:
            dataset = Samples()
            model = torch.nn.Sequential(*make_layers())
            engine, _, loader, _ = deepspeed.initialize(model=model,
                                                        model_parameters=model.parameters(),
                                                        training_data=dataset,
                                                        config=config(path, micro, gas, directory))
            reference = torch.nn.Sequential(*make_layers()).double()
            before = zero_master_weights(engine)
            batches, reference_norm = [], None
            micro_batches = iter(loader)
            for _ in range(STEPS):
                mine = []
                for _ in range(gas):
                    inputs, targets, indices = next(micro_batches)
                    engine.backward(mse(engine(inputs.to(engine.device)), targets.to(engine.device)))
                    engine.step()
                    mine += indices.tolist()
                everyone = [None] * dist.get_world_size()
                dist.all_gather_object(everyone, mine)
                batch = sorted(i for rank_samples in everyone for i in rank_samples)
                batches.append(batch)
                reference.zero_grad()
                mse(reference(dataset.inputs[batch].double()), dataset.targets[batch].double()).backward()
                reference_norm = reference_sgd_step(reference.parameters(), LR, CLIP)
            norm = engine.get_global_grad_norm()
            after = zero_master_weights(engine)
            engine.destroy()
        expected = dict(reference.named_parameters())
        names = sorted(before)
        return {
            "global_batches": batches,
            "hardest": [max(difficulty(i) for i in batch) for batch in batches],
            "norm": None if norm is None else float(norm),
            "reference_norm": reference_norm,
            "update_error":
            relative_update_error(*([d[n].detach() for n in names] for d in (after, expected, before))),
        }

    return run


if __name__ == "__main__":
    run_cases({f"{p}_m{m}_g{g}": case(p, m, g) for p in PATHS for m, g in SPLITS})
