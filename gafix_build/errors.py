# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team


class BuildError(Exception):
    """A build input is wrong or missing; the message names the file, setting or patch at fault."""
