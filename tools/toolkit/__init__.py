# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What the maintainers' tools and benchmarks share: free ports, pristine's interpreter, pytest's outcomes.

Put ``tools/`` on ``sys.path`` and import a module: ``from toolkit import junit, ports, sides``.
"""
