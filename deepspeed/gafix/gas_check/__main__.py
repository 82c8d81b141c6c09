# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team

import sys

from .cli import main

sys.exit(main())
