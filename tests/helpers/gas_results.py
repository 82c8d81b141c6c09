# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""How ds_gas_check's per-split results read in a failed assertion."""


def describe(rows):
    return "\n".join(f"{r['name']}: norm error {r['norm_error']:.2e}, update errors {r['update_errors']}, "
                     f"{r['diagnosis']}" for r in rows)
