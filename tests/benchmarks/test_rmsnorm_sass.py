"""The static SASS counter (no GPU needed; nvcc, cuobjdump and nvdisasm where installed)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import rmsnorm_sass as rs  # noqa: E402

from examples.rmsnorm_problem import FWD_SEED_PARAMS  # noqa: E402

SAMPLE = """
        /*0600*/                   MOV R34, R38 ;                        /* 0x0000002600227202 */
        /*0610*/                   LDG.E.NA.128.CONSTANT R24, desc[UR8][R24.64] ;
        /*0620*/                   SHFL.BFLY PT, R59, R28, 0x10, 0x1f ;
        /*0630*/                   F2FP.BF16.F32.PACK_AB R4, R4, R21 ;
        /*0640*/                   STG.E.EF.128 desc[UR8][R20.64], R4 ;
        /*0650*/              @!P1 BRA 0x600 ;
        /*0660*/                   LDG.E.128 R8, desc[UR8][R2.64] ;
        /*0670*/                   STG.E.128 desc[UR8][R2.64], R8 ;
        /*0680*/               @P0 BRA 0x660 ;
        /*0690*/                   BRA 0x6a0 ;
        /*06a0*/                   EXIT ;
"""


def test_parse_and_loops() -> None:
    instrs = rs.parse_sass(SAMPLE)
    assert [i.addr for i in instrs][:2] == [0x600, 0x610] and instrs[5].op == "BRA"
    found = rs.loops(instrs)
    assert [(lp.start, lp.end, lp.instructions, lp.loads, lp.stores, lp.shuffles, lp.dtype) for lp in found] == [
        (0x600, 0x650, 6, 1, 1, 1, "bf16"), (0x660, 0x680, 3, 1, 1, 0, "fp32")]
    assert found[0].per_store == 6.0  # a forward branch (0x690) is no loop


def test_invalid_params_say_why() -> None:
    with pytest.raises(SystemExit, match="TPR"):
        rs.main(["--params", '{"THREADS": 32, "TPR": 64}'])
    with pytest.raises(SystemExit, match="not JSON"):
        rs.main(["--params", "{THREADS: 32}"])


needs_tools = pytest.mark.skipif(shutil.which("nvcc") is None or rs.find_tool("cuobjdump") is None
                                 or rs.find_tool("nvdisasm") is None,
                                 reason="nvcc, cuobjdump or nvdisasm not installed")


@needs_tools
def test_row_tile_whole_steps_are_the_short_loop(tmp_path: Path) -> None:
    """A one-warp STAGE 4 seed: per dtype a loop over whole steps (no tests) much shorter than the
    tested loop, both storing TILE_ROWS * MAX_VECS vectors; and the table the command line writes."""
    seed = next(p for p in FWD_SEED_PARAMS if p["STAGE"] == 4 and p["THREADS"] == 32 and p["TILE_ROWS"] == 4)
    cuobjdump, nvdisasm = rs.find_tool("cuobjdump"), rs.find_tool("nvdisasm")
    got = rs.measure(rs.forward_source(), seed, cuobjdump, nvdisasm)
    assert got["spill_bytes"] == 0 and got["registers"] <= 64
    tiles = seed["TILE_ROWS"] * seed["MAX_VECS"]
    for dtype in ("fp32", "fp16", "bf16"):
        row_loops = [lp for lp in got["loops"] if lp.dtype == dtype and lp.shuffles and lp.stores == tiles]
        assert len(row_loops) == 2, got["loops"]
        whole, tested = row_loops
        assert whole.instructions < 0.75 * tested.instructions
    out = tmp_path / "t.md"
    assert rs.main(["--params", '{"STAGE": 4, "THREADS": 32, "TPR": 32, "MAX_VECS": 1, "TILE_ROWS": 4, '
                    '"OCCUPANCY": 32, "VEC_BYTES": 16, "LOAD_HINT": 1, "STORE_HINT": 1}', "--out", str(out)]) == 0
    assert "ST4 TH32 TP32 MA1 TI4" in out.read_text()
