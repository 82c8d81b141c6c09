# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Regression: every CPU launch left one ~69 MB /dev/shm/deepspeed_allreduce_buffer_* per rank behind.

Fails on upstream 0.19.8 (two names per 2-rank launch); the fork removes each name once all ranks
have mapped the buffers (patch "Remove the CPU shm all-reduce buffers' names once all ranks mapped them").
"""

import pytest

from toolkit.launch import launch_cases
from helpers.repo import REPO

WORKER = REPO / "tests" / "workers" / "shm_buffers.py"


@pytest.fixture(scope="module")
def launched(extensions_dir):
    return launch_cases(WORKER, nprocs=2, extensions_dir=extensions_dir, timeout=900)


def test_no_shm_names_once_initialized(launched):
    assert launched.case("shm_names_after_init") == [[], []]


def test_launch_leaves_no_shm_file(launched):
    assert launched.returncode == 0, launched.tail()
    assert launched.leaked_shm == []


def test_shm_all_reduce_still_sums(launched):
    for errors in launched.case("shm_all_reduce_sums"):
        assert errors and all(error == 0.0 for error in errors.values()), errors
