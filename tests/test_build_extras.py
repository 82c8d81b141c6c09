# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The fork's pip extras (``.[hf]``, ``.[plot]``): read from requirements-<extra>.txt, added to upstream's,
never replacing one."""

import importlib.metadata

import pytest

from helpers.repo import REPO

from gafix_build import BuildError, read_extras, with_extras


def test_extras_are_read_from_their_files(tmp_path):
    (tmp_path / "requirements-hf.txt").write_text("# comment\ntransformers==1.0  # why\n\naccelerate==2.0\n")
    (tmp_path / "requirements-plot.txt").write_text("matplotlib\n")
    assert read_extras(tmp_path) == {"hf": ["transformers==1.0", "accelerate==2.0"], "plot": ["matplotlib"]}


def test_missing_file_names_it(tmp_path):
    (tmp_path / "requirements-plot.txt").write_text("matplotlib\n")
    with pytest.raises(BuildError, match="requirements-hf.txt: no such file"):
        read_extras(tmp_path)


def test_extras_are_added_to_upstreams():
    seen = {}
    with_extras(lambda **kwargs: seen.update(kwargs), {"hf": ["x"]})(name="deepspeed", extras_require={"dev": ["y"]})
    assert seen == {"name": "deepspeed", "extras_require": {"dev": ["y"], "hf": ["x"]}}


def test_an_upstream_extra_of_the_same_name_is_refused():
    with pytest.raises(BuildError, match=r"already defines the extra\(s\) \['hf'\]"):
        with_extras(lambda **kwargs: None, {"hf": ["x"]})(extras_require={"hf": ["z"]})


@pytest.mark.fork_only
@pytest.mark.parametrize("extra", ["hf", "plot"])
def test_installed_wheel_declares_the_extra(extra):
    """The installed metadata carries exactly the pins of requirements-<extra>.txt under the extra."""
    declared = sorted(
        r.split(";")[0].strip() for r in importlib.metadata.requires("deepspeed") or [] if f'extra == "{extra}"' in r)
    assert declared == sorted(read_extras(REPO)[extra])
