# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The GAS checker's package on either side: the installed ``deepspeed.gafix.gas_check`` on the fork; on pristine
upstream, which has none, this repository's copy, loaded from its files under the name ``gas_check`` (the checker
judging pristine's engine). The repository's folder is not put on ``sys.path``."""

import importlib
import importlib.util
import sys

from helpers.repo import REPO

INSTALLED = "deepspeed.gafix.gas_check"
FROM_FILES = "gas_check"


def gas_check(submodule=None):
    """The checker's package, or its ``submodule`` (``"sequence"``)."""
    try:
        importlib.import_module(INSTALLED)
        name = INSTALLED
    except ModuleNotFoundError as err:
        if err.name not in ("deepspeed.gafix", INSTALLED):
            raise  # the fork's checker is there and failed to import: never judge with another copy
        name = _from_files()
    return importlib.import_module(f"{name}.{submodule}" if submodule else name)


def _from_files():
    if FROM_FILES not in sys.modules:
        folder = REPO / "deepspeed" / "gafix" / "gas_check"
        spec = importlib.util.spec_from_file_location(FROM_FILES,
                                                      folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
        package = importlib.util.module_from_spec(spec)
        sys.modules[FROM_FILES] = package
        spec.loader.exec_module(package)
    return FROM_FILES
