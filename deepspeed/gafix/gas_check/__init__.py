# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""``ds_gas_check``: does a DeepSpeed config give the same training whatever the GAS split?

The same global batch is trained as micro-batch x GAS x ranks in several ways and compared with a
plain fp64 PyTorch run from the same weights: the engine's reported grad norm and the fp32
master-weight update after the first and the last step. The model and data can be the user's own
(``--model``, ``--data``, ``--loss``, ``--hf-model``). A failing check comes with a diagnosis that
names a known mistake (summed over micro-batches, over ranks, a loss scale...) only when its factor
explains every split.

Only public DeepSpeed APIs are used, so it runs against pristine upstream too::

    deepspeed --num_gpus 2 --no_local_rank --module deepspeed.gafix.gas_check --config ds_config.json
    ds_gas_check --config ds_config.json --ranks 2          # the same, launched for you
"""

from .check import SplitResult, check_gas_invariance
from .diagnosis import Observation, explain

__all__ = ["SplitResult", "check_gas_invariance", "Observation", "explain"]
