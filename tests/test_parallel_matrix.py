# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""tools/parallel_matrix.py: the GAS matrix's MoE, SP and AutoTP cells from their workers' per-rank results."""

import parallel_matrix


def ok(norm, reference, update_error):
    return {"ok": True, "value": {"norm": norm, "reference_norm": reference, "update_error": update_error}}


def test_a_cell_passes_only_when_every_rank_is_within_tolerance():
    ranks = [
        {
            "zero1_fp32_m4_g1": ok(2.0, 2.0, 1e-7),
            "zero1_fp32_m2_g2": ok(2.0, 2.0, 1e-7),
            "zero0_fp32_m4_g1": ok(None, 2.0, 1e-7),
            "zero2_bf16_m4_g1": ok(2.004, 2.0, 1e-2),
            "zero2_fp32_m4_g1": ok(2.0, 2.0, 1e-7),
            "zero0_fp32_per_item_m4_g1": {
                "ok": False,
                "error": "Traceback\nTypeError: unexpected 'num_items'\n"
            },
        },
        {
            "zero1_fp32_m4_g1": ok(2.0, 2.0, 1e-7),
            "zero1_fp32_m2_g2": ok(2.0, 2.0, 3e-3),  # one rank's update is off: the cell fails
            "zero0_fp32_m4_g1": ok(None, 2.0, 0.25),  # no norm, and a wrong update: the cell says both
            "zero2_bf16_m4_g1": ok(2.004, 2.0, 1e-2),
            "zero2_fp32_m4_g1": ok(1.5, 2.0, 1e-7),
            "zero0_fp32_per_item_m4_g1": {
                "ok": True,
                "value": {}
            },
        }
    ]
    table, splits = parallel_matrix.rows("moe_ep2", ranks)
    assert splits == ["4x1", "2x2"]
    assert table["moe_ep2_zero1_fp32"] == {"4x1": "PASS", "2x2": "FAIL update error 0.003"}
    assert table["moe_ep2_zero0_fp32"] == {"4x1": "FAIL update error 0.25, no norm reported"}
    assert table["moe_ep2_zero2_bf16"] == {"4x1": "PASS"}
    assert table["moe_ep2_zero2_fp32"] == {"4x1": "FAIL norm x0.75"}
    assert table["moe_ep2_zero0_fp32_per_item"] == {"4x1": "error: TypeError: unexpected 'num_items'"}
    lines = parallel_matrix.markdown("MoE", table, splits, "fork").splitlines()
    assert lines[0] == "| MoE: per-rank splits 4x1 / 2x2 | fork |"
    assert lines[2] == "| moe_ep2_zero1_fp32 | PASS / FAIL update error 0.003 |"
    assert "| moe_ep2_zero2_bf16 | PASS |" not in lines, "a split it has no cell for is no pass"
    assert "| moe_ep2_zero2_bf16 | PASS / - |" in lines
    assert parallel_matrix.summary({"4x1": "FAIL x", "2x2": "FAIL x"}, ["4x1", "2x2"]) == "FAIL x (every split)"


def test_sequence_parallel_cases_and_the_tests_tolerances():
    table, _ = parallel_matrix.rows("sp2", [{"zero1_fp32_sp2_m2_g2": ok(1.0, 1.0, 1e-6)}])
    assert table == {"sp2_zero1_fp32": {"2x2": "PASS"}}
    from test_moe_norm import NORM_TOLERANCE, UPDATE_TOLERANCE
    assert parallel_matrix.NORM_TOLERANCE == NORM_TOLERANCE
    assert parallel_matrix.UPDATE_TOLERANCE["moe_ep2"] == UPDATE_TOLERANCE
    assert parallel_matrix.UPDATE_TOLERANCE["moe_tp2"] == UPDATE_TOLERANCE  # test_moe_tp_norm.py takes them
    assert parallel_matrix.UPDATE_TOLERANCE["moe_pipe2"] == UPDATE_TOLERANCE  # test_moe_pipe_norm.py too
