# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Build the ``deepspeed`` wheel of deepspeed-gafix.

1. take the pinned upstream sdist (``upstream.json``; ``DS_GAFIX_UPSTREAM_SDIST`` for a local file),
2. apply ``patches/series`` and copy our own files (``deepspeed/``, ``csrc/``, ``op_builder/``) in,
3. run upstream's own setup.py on that tree, so ops, extras and ``DS_BUILD_<OP>`` behave as upstream's
   (with our own extras added: ``.[hf]``, see gafix_build/extras.py).

Any wrong input stops the build with one line naming it, before anything is built.
"""

import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    sys.path.insert(0, HERE)
    try:
        from gafix_build import BuildError, assemble_tree, read_extras, with_extras, with_supported_versions
    finally:
        sys.path.remove(HERE)

    if os.environ.get("DS_BUILD_STRING"):
        sys.exit("error: deepspeed-gafix: DS_BUILD_STRING is not supported: it would replace the fork's version "
                 "label (+gafix.N, set by the first patch in patches/series)")
    try:
        tree = str(assemble_tree(HERE))
        extras = read_extras(HERE)
    except BuildError as err:
        sys.exit(f"error: deepspeed-gafix: {err}")

    # Upstream's setup.py expects to run from its own directory and imports op_builder/ from there;
    # it calls setuptools.setup, which gets our extras (``.[hf]``) added to upstream's and the tested versions
    # (gafix_build/supported.py) in its classifiers and summary.
    import setuptools
    upstream_setup = setuptools.setup
    setuptools.setup = with_supported_versions(with_extras(upstream_setup, extras))
    cwd = os.getcwd()
    os.chdir(tree)
    sys.path.insert(0, tree)
    try:
        runpy.run_path(os.path.join(tree, "setup.py"), run_name="__main__")
    except BuildError as err:
        sys.exit(f"error: deepspeed-gafix: {err}")
    finally:
        sys.path.remove(tree)
        os.chdir(cwd)
        setuptools.setup = upstream_setup


main()
