# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""transformers' DeepSpeed test classes on a CPU, their bodies unchanged (tools/client-tier copies this file beside
tests/trainer/distributed/test_trainer_distributed_deepspeed.py in its scratch copy of the client tests).

Two gates stand between these tests and DeepSpeed on a CPU, neither about what they check:
- the class decorator require_torch_accelerator: the subclasses below are not skipped (method-level gates, such
  as require_torch_fp16 or require_deepspeed_aio, stay);
- TrainingArguments refuses bf16 without a GPU unless use_cpu is set ("Your setup doesn't support bf16/gpu"):
  every TrainingArguments here is made with use_cpu=True. DeepSpeed still runs the engine, on its CPU
  accelerator.
"""

from transformers import TrainingArguments

from .test_trainer_distributed_deepspeed import TestNonTrainerIntegrationDeepSpeed as _NonTrainer
from .test_trainer_distributed_deepspeed import TestTrainerIntegrationDeepSpeed as _Trainer

_post_init = TrainingArguments.__post_init__


def _post_init_on_cpu(self):
    self.use_cpu = True
    _post_init(self)


TrainingArguments.__post_init__ = _post_init_on_cpu


class TestDSCpu(_Trainer):
    __unittest_skip__ = False


class TestDSCpuNonTrainer(_NonTrainer):
    __unittest_skip__ = False
