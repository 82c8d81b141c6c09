# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""DeepCompile on one GPU without ds_gas_check: two optimizer steps at GAS 2 against plain PyTorch.

    RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 \\
        python tests/workers/deepcompile_probe.py z1_inside|z1_outside|z3_zinit_inside|z3_outside|z1_outside_twice

The variant names the ZeRO pass (z1, z3), where the loss is computed (``inside`` the compiled module, as upstream's
tests do, or ``outside`` it, as ds_gas_check does), whether a ZeRO-3 model is built under ``zero.Init`` (``zinit``),
whether two engines are built one after the other in the process (``twice``, as ds_gas_check's splits are), and
``nocompile``: the same without ``engine.compile()``, the control (it runs on a CPU too).
Prints one ``PROBE {json}`` line per engine: the engine's reported norms, plain PyTorch's, and the largest relative
difference of the weights after the two steps. fp32, Adam, no clipping.
"""

import copy
import json
import sys

import torch

import deepspeed
from deepspeed.accelerator import get_accelerator

variant = sys.argv[1]
stage = int(variant[1])
inside = "inside" in variant
zinit = "zinit" in variant
engines = 2 if "twice" in variant else 1
GAS = 2


class Net(torch.nn.Module):

    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(16, 32)
        self.l2 = torch.nn.Linear(32, 4)

    def forward(self, x, y=None):
        out = self.l2(torch.relu(self.l1(x)))
        return torch.nn.functional.mse_loss(out, y) if y is not None else out


config = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": GAS,
    "zero_optimization": {
        "stage": stage
    },
    "compile": {
        "deepcompile": True
    },
    "optimizer": {
        "type": "Adam",
        "params": {
            "lr": 1e-2,
            "weight_decay": 0.0
        }
    },
    "gradient_clipping": 0.0,
}
deepspeed.init_distributed()
device = torch.device(get_accelerator().current_device_name())
torch.manual_seed(0)
xs = [torch.randn(4, 16, device=device) for _ in range(2 * GAS)]
ys = [torch.randn(4, 4, device=device) for _ in range(2 * GAS)]
for index in range(engines):
    torch.manual_seed(1)
    source = Net()
    if zinit:
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = Net()
        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
            for p, q in zip(model.parameters(), source.parameters()):
                p.data.copy_(q.data)
    else:
        model = copy.deepcopy(source)
    plain = source.to(device)
    optimizer = torch.optim.Adam(plain.parameters(), lr=1e-2)
    engine = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)[0]
    if "nocompile" not in variant:
        engine.compile()
    row = {"variant": variant, "engine": index, "norm": [], "plain_norm": []}
    for step in range(2):
        for i in range(GAS):
            x, y = xs[GAS * step + i], ys[GAS * step + i]
            loss = engine(x, y) if inside else torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
            (torch.nn.functional.mse_loss(plain(x), y) / GAS).backward()
        row["norm"].append(float(engine.get_global_grad_norm() or 0.0))
        row["plain_norm"].append(float(torch.nn.utils.clip_grad_norm_(plain.parameters(), float("inf"))))
        optimizer.step()
        optimizer.zero_grad()
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        got = [p.detach().float().clone() for p in engine.module.parameters()]
    row["max_update_error"] = max(
        float((g - w).abs().max() / w.abs().max())
        for g, w in zip(got, (p.detach().float() for p in plain.parameters())))
    print("PROBE " + json.dumps(row), flush=True)
    engine.destroy()
