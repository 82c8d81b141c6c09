# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The engine-surface map (docs/reference/engine_surface.toml): every config key the installed engine reads
has a row saying how the fork's promise stands on it, and the check fails on a key that has none, as a
rebase that brings a new key would."""

import gc
from unittest import mock

import pytest

import engine_surface

# The map describes the fork: 0.19.8 lacks the fork's own keys (loss_normalization).
pytestmark = pytest.mark.fork_only


@pytest.fixture(scope="module")
def surface():
    return engine_surface.surface()


def test_every_key_the_engine_reads_has_a_row(surface):
    keys, unmapped = surface
    assert len(keys) > 200, f"the surface read off the engine is too small to be whole: {keys}"
    assert engine_surface.problems(keys, engine_surface.load_map(), unmapped) == []


def test_the_pages_are_the_map_rendered(surface):
    keys, _ = surface
    assert engine_surface.stale_pages(engine_surface.load_map(), keys) == [], "run tools/engine_surface.py --write"


def test_each_row_is_on_exactly_one_page():
    rows = engine_surface.load_map()
    assert [sum(holds(row) for holds in engine_surface.PAGES.values()) for row in rows] == [1] * len(rows)


def test_a_new_field_of_a_config_model_fails_the_check():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    class SeededZeroConfig(DeepSpeedZeroConfig):
        seeded_gradient_knob: int = 0

    models = dict(engine_surface.SECTION_MODELS, zero_optimization=SeededZeroConfig)
    keys, unmapped = engine_surface.surface(models)
    assert engine_surface.problems(keys, engine_surface.load_map(), unmapped) == [
        "zero_optimization.seeded_gradient_knob: no row in docs/reference/engine_surface.toml "
        "(what does the fork promise on it?)"
    ]


def test_a_new_key_of_the_config_parser_fails_the_check():
    import deepspeed.runtime.config as config

    def clipping_and_a_new_key(param_dict):
        param_dict.get("seeded_top_level_key")
        return config.get_scalar_param(param_dict, "gradient_clipping", 1.0)

    with mock.patch.object(config, "get_gradient_clipping", clipping_and_a_new_key):
        keys, unmapped = engine_surface.surface()
    problems = engine_surface.problems(keys, engine_surface.load_map(), unmapped)
    assert problems == [
        "seeded_top_level_key: no row in docs/reference/engine_surface.toml (what does the fork promise on it?)"
    ]


def test_a_config_model_no_section_reaches_fails_the_check():
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel

    seeded = type("SeededConfig", (DeepSpeedConfigModel, ), {"__module__": "deepspeed.runtime.seeded"})
    try:
        _, unmapped = engine_surface.surface()
        assert unmapped == ["deepspeed.runtime.seeded.SeededConfig"]
    finally:
        del seeded
        gc.collect()


def test_rows_are_checked_for_what_their_status_needs():
    keys = ["a", "b.c", "b.d"]
    rows = [
        dict(keys=["a"], status="covered", tests=["tests/no_such_test.py"]),
        dict(keys=["b.*"], status="open"),
        dict(keys=["b.d"], status="sometimes", note="x"),  # takes b.d from the b.* row
        dict(keys=["gone"], status="off-path", note="x"),
    ]
    assert engine_surface.problems(keys, rows) == [
        "['a']: test tests/no_such_test.py does not exist",
        "['b.*']: a 'open' row needs its 'note'",
        "['b.d']: status 'sometimes' is none of " + str(sorted(engine_surface.STATUSES)),
        "gone: a row, but the engine reads no such key",
    ]
