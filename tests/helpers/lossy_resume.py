# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""``--model helpers.lossy_resume:make_model`` for ds_gas_check's restart control: the built-in MLP, in ranks whose
engine loads checkpoints without their optimizer states (as a script passing ``load_optimizer_states=False``
would). The weights it loads are right; the first step after them is not, and the restart check must say so."""

from deepspeed.runtime.engine import DeepSpeedEngine

from deepspeed.gafix.gas_check.models import builtin_model

_load_checkpoint = DeepSpeedEngine.load_checkpoint


def _without_optimizer_states(self, *args, **kwargs):
    kwargs["load_optimizer_states"] = False
    return _load_checkpoint(self, *args, **kwargs)


DeepSpeedEngine.load_checkpoint = _without_optimizer_states


def make_model():
    return builtin_model()
