# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The clients' DeepSpeed tests on CPU ranks, their bodies unchanged: tools/client-tier puts this folder first on
PYTHONPATH (every selection but the as-shipped ones), so it runs in pytest's process and in every process a test
launches (``accelerate launch``, its ranks).

It changes three answers, none of them about what the tests check, each once its module is imported:
- ``accelerate.test_utils.testing``: ``require_non_cpu`` and ``require_multi_device`` stand for "an accelerator
  DeepSpeed can run on" and "more than one rank"; DeepSpeed's CPU accelerator is the first and gloo ranks are the
  second, so both let the test run, and ``device_count`` (the ranks a test launches) is 2. Every other gate
  (``require_cuda``, ``require_huggingface_suite``, ``slow``, ...) stays;
- ``deepspeed.accelerator.cpu_accelerator``: fp16 is reported supported (as the fork's own rank workers do): the
  engine's fp16 paths are device-independent, only a CPU without AVX512-FP16/AMX has no fast fp16 kernels. This
  is what lets accelerate's and transformers' fp16 tests run here.
"""

import importlib.abc
import importlib.machinery
import sys

RANKS = 2


def _lift_accelerate_gates(testing):

    def runs(test_case):
        return test_case

    testing.require_non_cpu = runs
    testing.require_multi_device = runs
    testing.device_count = RANKS


def _cpu_fp16(cpu_accelerator):
    cpu_accelerator.CPU_Accelerator.is_fp16_supported = lambda self: True


AFTER_IMPORT = {
    "accelerate.test_utils.testing": _lift_accelerate_gates,
    "deepspeed.accelerator.cpu_accelerator": _cpu_fp16,
}


class _Patched(importlib.abc.Loader):

    def __init__(self, loader, patch):
        self.loader, self.patch = loader, patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module)


class _AfterImport(importlib.abc.MetaPathFinder):

    def find_spec(self, name, path, target=None):
        if name not in AFTER_IMPORT:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Patched(spec.loader, AFTER_IMPORT[name])
        return spec


sys.meta_path.insert(0, _AfterImport())
