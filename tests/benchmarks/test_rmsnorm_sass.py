"""The static SASS counter (no GPU needed; nvcc, cuobjdump and nvdisasm where installed)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import rmsnorm_sass as rs  # noqa: E402

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
        rs.complete_params({"THREADS": 32, "TPR": 64})


needs_tools = pytest.mark.skipif(shutil.which("nvcc") is None or rs.find_tool("cuobjdump") is None
                                 or rs.find_tool("nvdisasm") is None,
                                 reason="nvcc, cuobjdump or nvdisasm not installed")

