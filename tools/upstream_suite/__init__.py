# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Upstream DeepSpeed's own test suite, fork vs pristine (docs/develop/upstream_suite.md). Entry: tools/run-upstream-suite."""
