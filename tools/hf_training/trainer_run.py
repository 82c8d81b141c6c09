# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Train one case with the Hugging Face Trainer and record what it applied.

The applied gradient of step t is read off the fp32 master weights, (w[t-1] - w[t]) / lr, with
plain SGD (no momentum, no weight decay, constant lr, no clipping): that is the gradient the
optimizer received, whatever the engine did to the loss on the way. An optimizer pre-step hook
measures its norm a second way, from the gradients the torch optimizer holds when it steps.
"""

import contextlib
import tempfile

import torch

from .batches import Rows
from .tiny_models import load

BACKENDS = {
    "none": None,
    "zero0": {
        "stage": 0
    },
    "zero1": {
        "stage": 1
    },
    "zero2": {
        "stage": 2
    },
    "zero3": {
        "stage": 3
    },
    "zero2_offload": {
        "stage": 2,
        "offload_optimizer": {
            "device": "cpu"
        }
    },
    "zero3_offload": {
        "stage": 3,
        "offload_optimizer": {
            "device": "cpu"
        },
        "offload_param": {
            "device": "cpu"
        }
    },
}

# TrainingArguments every test run shares: on the CPU, seeded, a loss logged each step, no reporting or progress bar.
CPU_RUN_ARGS = dict(use_cpu=True, seed=0, logging_steps=1, report_to=[], disable_tqdm=True)


def deepspeed_config(backend):
    """The DeepSpeed config a Trainer user writes: sizes and clipping left to the Trainer ("auto")."""
    zero = BACKENDS[backend]
    if zero is None:
        return None
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "zero_optimization": dict(zero),
        # The Trainer's torch SGD, also on the offload paths (DeepSpeed would insist on its CPU Adam).
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
    }


def full_fp32_weights(model):
    """Every parameter's full fp32 master value (gathered where ZeRO partitions it), flat, as fp64."""
    from deepspeed.utils import safe_get_full_fp32_param
    flat = []
    for param in model.parameters():
        full = safe_get_full_fp32_param(param)
        flat.append((param.detach() if full is None else full).double().flatten().cpu())
    return torch.cat(flat)


def make_recorder(partitioned):
    """A TrainerCallback that snapshots the weights at each step and the optimizer hook's grad norm."""
    from transformers import TrainerCallback
    import deepspeed.comm as dist

    class AppliedGradientRecorder(TrainerCallback):

        def __init__(self):
            self.weights = []
            self.hook_norms = []
            self._sumsq = {}

        def watch(self, optimizer):
            optimizer.register_step_pre_hook(self._on_optimizer_step)

        def _on_optimizer_step(self, optimizer, args, kwargs):
            # ZeRO-3 may step once per sub-group: key by tensor so nothing is counted twice.
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is not None:
                        self._sumsq[id(param)] = float(param.grad.double().pow(2).sum())

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.weights.append(full_fp32_weights(model))

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self.weights.append(full_fp32_weights(model))
            total = torch.tensor([sum(self._sumsq.values())], dtype=torch.float64)
            if partitioned and dist.get_world_size() > 1:
                # Each rank's optimizer holds only its own shard of the gradient.
                dist.all_reduce(total)
            self.hook_norms.append(float(total.sqrt()))
            self._sumsq = {}

    return AppliedGradientRecorder()


@contextlib.contextmanager
def process_state_reset():
    """Around a Trainer's training: the Trainer leaves process-wide state behind (the DeepSpeed config it set, the
    accelerator's state), and the next case in the process must start clean."""
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config
    from accelerate.state import AcceleratorState
    try:
        yield
    finally:
        unset_hf_deepspeed_config()
        AcceleratorState._reset_state(reset_partial_state=False)


def ordered_trainer_class():
    from transformers import Trainer

    class OrderedTrainer(Trainer):
        """Reads the rows in order, so the reference knows every micro-batch; lets the recorder watch
        the optimizer the Trainer creates (DeepSpeed wraps that same torch optimizer)."""
        recorder = None

        def _get_train_sampler(self, *args, **kwargs):
            return torch.utils.data.SequentialSampler(self.train_dataset)

        def create_optimizer(self, *args, **kwargs):
            optimizer = super().create_optimizer(*args, **kwargs)
            self.recorder.watch(optimizer)
            return optimizer

    return OrderedTrainer


def train_case(model_dir, rows, backend, micro_batch, gas, steps, lr, accepts_loss_kwargs):
    """Train; return per step: applied gradient (flat fp64), hook norm, logged loss and grad_norm."""
    from transformers import TrainingArguments

    # Before TrainingArguments: a ZeRO-3 config there would make from_pretrained partition the model.
    model = load(model_dir)
    with tempfile.TemporaryDirectory(prefix="ds-gafix-hf-") as output_dir:
        args = TrainingArguments(output_dir=output_dir,
                                 per_device_train_batch_size=micro_batch,
                                 gradient_accumulation_steps=gas,
                                 max_steps=steps,
                                 learning_rate=lr,
                                 optim="sgd",
                                 lr_scheduler_type="constant",
                                 weight_decay=0.0,
                                 max_grad_norm=0.0,
                                 save_strategy="no",
                                 deepspeed=deepspeed_config(backend),
                                 **CPU_RUN_ARGS)
        trainer_class = ordered_trainer_class()
        recorder = make_recorder(partitioned=backend not in ("none", "zero0"))
        trainer = trainer_class(model=model, args=args, train_dataset=Rows(rows), callbacks=[recorder])
        trainer.recorder = recorder
        if accepts_loss_kwargs is not None:
            trainer.model_accepts_loss_kwargs = accepts_loss_kwargs
        with process_state_reset():
            trainer.train()
        logs = [entry for entry in trainer.state.log_history if "loss" in entry and "train_loss" not in entry]
        applied = [(recorder.weights[t] - recorder.weights[t + 1]) / lr for t in range(len(recorder.weights) - 1)]
        return {
            "accepts_loss_kwargs": trainer.model_accepts_loss_kwargs,
            "applied": applied,
            "hook_norms": recorder.hook_norms,
            "logged_loss": [float(entry["loss"]) for entry in logs],
            "logged_grad_norm": [float(entry["grad_norm"]) if "grad_norm" in entry else None for entry in logs],
        }
