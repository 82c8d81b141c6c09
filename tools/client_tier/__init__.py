# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
