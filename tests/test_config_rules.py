# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""ds_gas_check's own rules for a config (deepspeed/gafix/gas_check/config_rules.py): the batch arithmetic's values
that would work, JSON errors at the character, pydantic's refusals by the user's key."""

import json

import pytest

from deepspeed.gafix.gas_check import config_rules

pytestmark = pytest.mark.fork_only


@pytest.mark.parametrize("config, world, said", [
    ({
        "train_batch_size": 30,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2
    }, 2, 'would work: "train_batch_size": 16, or train_batch_size left out (DeepSpeed computes it)'),
    ({
        "train_batch_size": 24,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2
    }, 2,
     '"train_batch_size": 16, or train_batch_size left out (DeepSpeed computes it), or "gradient_accumulation_steps": '
     '3, or "train_micro_batch_size_per_gpu": 6'),
    ({
        "train_batch_size": 7
    }, 2, 'would work: "train_batch_size": 6 or "train_batch_size": 8'),
    ({
        "train_batch_size": 20,
        "train_micro_batch_size_per_gpu": 3
    }, 2, "a multiple of 6); would work: "
     '"train_batch_size": 18 or "train_batch_size": 24'),
    ({
        "train_batch_size": 3
    }, 4, 'would work: "train_batch_size": 4'),
    ({
        "gradient_accumulation_steps": True
    }, 1, "gradient_accumulation_steps: true: a batch size or step count"),
])
def test_batch_refusals_offer_values_that_work(config, world, said):
    (line, ) = config_rules.batch_refusals(config, world)
    assert said in line


@pytest.mark.parametrize("config", [{
    "train_batch_size": 32,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 4
}, {
    "train_batch_size": 16
}, {}])
def test_consistent_batch_keys_pass(config):
    assert config_rules.batch_refusals(config, 2) == []


@pytest.mark.parametrize("text, said", [
    ('{\n  "a": 1,\n}', "line 2 column 9: a trailing comma: JSON allows none before '}'\n    \"a\": 1,\n          ^"),
    ('{\n  "a": 1\n  "b": 2\n}', "line 2 column 8: a comma is missing after this value"),
    ('{"a": [1, 2,]}', "line 1 column 12: a trailing comma: JSON allows none before ']'"),
    ("{'a': 1}", "line 1 column 2: expecting property name enclosed in double quotes"),
])
def test_json_errors_point_at_the_mistake(text, said):
    with pytest.raises(json.JSONDecodeError) as err:
        json.loads(text)
    assert said in config_rules.json_error("ds.json", text, err.value)


def test_pydantic_refusals_name_the_users_key():
    from deepspeed.gafix.config_surface import SECTION_MODELS
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    with pytest.raises(Exception) as err:
        DeepSpeedZeroConfig(stage=5, offload_optimizer={"device": "disk"}, overlap_com=True)
    lines = config_rules.pydantic_refusals(err.value, SECTION_MODELS, {"zero_optimization.overlap_com"})
    assert lines == [
        "zero_optimization.stage: 5: should be 0, 1, 2 or 3",
        "zero_optimization.offload_optimizer.device: \"disk\": should be 'none', 'cpu' or 'nvme'",
    ]
    assert config_rules.pydantic_refusals(ValueError("not pydantic's"), SECTION_MODELS, set()) is None
