# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Every mistake of docs/reference/mistakes.toml, run as a user runs it, is answered in the user's terms (its exit
status, and the key or flag as written with what would work), and docs/reference/messages.md shows what runs."""

import pytest

import messages_table

# ds_gas_check and the "unknown_keys" key are the fork's; the engine's warning is pinned on 0.19.8 by its patch's
# test in upstream's harness (unit/runtime/test_ds_config_unknown_keys.py).
pytestmark = pytest.mark.fork_only


@pytest.fixture(scope="module")
def answers(extensions_dir):
    return messages_table.run_all(env={"TORCH_EXTENSIONS_DIR": str(extensions_dir)})


def test_there_are_thirty_mistakes_or_more():
    assert len(messages_table.load()) >= 30


def test_each_mistake_is_answered_in_the_users_terms(answers):
    missed = {
        mistake["what"]: (problems, lines[-6:])
        for mistake, (status, lines) in answers if (problems := messages_table.problems(mistake, status, lines))
    }
    assert missed == {}


def test_the_page_shows_what_runs(answers):
    from deepspeed.accelerator import get_accelerator
    if get_accelerator().device_name() != "cpu":
        pytest.skip("the page is written on a CPU machine (fp16 is refused there only)")
    page = messages_table.PAGE.read_text()
    assert page == messages_table.page_with(messages_table.table(answers), page), \
        "docs/reference/messages.md: run tools/messages_table.py --write"
