# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""``ds_gas_check``: does a DeepSpeed config give the same training whatever the GAS split?

The same global batch is trained as micro-batch x GAS x ranks in several ways and compared with a
plain fp64 PyTorch run from the same weights: the engine's reported grad norm and the fp32
master-weight update after the first and the last step. A failing split comes with a diagnosis
(the factor between observed and expected, matched against GAS, world size, loss scale...).

Only public DeepSpeed APIs are used, so it runs against pristine upstream too::

    deepspeed --num_gpus 2 --no_local_rank --module deepspeed.gafix.gas_check --config ds_config.json
    ds_gas_check --config ds_config.json --ranks 2          # the same, launched for you
"""

from .check import SplitResult, check_gas_invariance
from .diagnosis import explain_factor

__all__ = ["SplitResult", "check_gas_invariance", "explain_factor"]
