# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Train with the Hugging Face Trainer as a user does (AdamW, warm-up then linear decay, clipping, checkpoints every
SAVE_STEPS), from the start or resumed with ``trainer.train(resume_from_checkpoint=...)``, and report where it
resumed and the weights it ends with.

The DeepSpeed config carries ``"checkpoint": {"reshard_on_load": true}`` so that a checkpoint written on another
number of processes loads (the Trainer calls ``engine.load_checkpoint``). Each process reads micro-batches of
MICRO_BATCH rows and GAS is set so that every step trains the same GLOBAL_BATCH rows whatever the number of processes.
"""

from .batches import GLOBAL_BATCH, Rows
from .tiny_models import load
from .trainer_run import CPU_RUN_ARGS, full_fp32_weights, process_state_reset

STEPS, SAVE_STEPS, MICRO_BATCH = 4, 2, 2
LR = 1e-2


def deepspeed_config(stage):
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "zero_optimization": {
            "stage": stage
        },
        "checkpoint": {
            "reshard_on_load": True
        },
    }


def train(model_dir, rows, output_dir, stage, world_size, resume_from=None):
    """Train to STEPS (saving under ``output_dir``); return the step it resumed at, the state it ends with and the
    full fp32 weights (flat list)."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class FirstStep(TrainerCallback):
        """The global step the Trainer starts training from (0, or the checkpoint's)."""
        first = None

        def on_step_begin(self, args, state, control, **kwargs):
            if self.first is None:
                self.first = state.global_step

    model = load(model_dir)
    args = TrainingArguments(output_dir=output_dir,
                             per_device_train_batch_size=MICRO_BATCH,
                             gradient_accumulation_steps=GLOBAL_BATCH // (MICRO_BATCH * world_size),
                             max_steps=STEPS,
                             learning_rate=LR,
                             warmup_steps=1,
                             lr_scheduler_type="linear",
                             weight_decay=0.01,
                             max_grad_norm=1.0,
                             save_strategy="steps",
                             save_steps=SAVE_STEPS,
                             deepspeed=deepspeed_config(stage),
                             **CPU_RUN_ARGS)
    first = FirstStep()
    trainer = Trainer(model=model, args=args, train_dataset=Rows(rows), callbacks=[first])
    with process_state_reset():
        trainer.train(resume_from_checkpoint=resume_from)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry and "train_loss" not in entry]
    return {
        "resumed_at": first.first,
        "global_step": trainer.state.global_step,
        "lr": trainer.lr_scheduler.get_last_lr()[0],
        "losses": [float(loss) for loss in losses],
        "weights": full_fp32_weights(trainer.model).tolist(),
    }
