"""Resource usage of the entry kernel, read from the ``ptxas -v`` report.

ptxas (13.x) prints, per entry function::

    ptxas info    : Compiling entry function 'kernel' for 'sm_90a'
    ptxas info    : Function properties for kernel
        256 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 32 registers, used 1 barriers, 256 bytes cumulative stack size, 1024 bytes smem

Older toolkits print ``Used 32 registers, 1024 bytes smem, 360 bytes cmem[0]``; both
forms are parsed, and a field that is absent reads as 0.
"""

from __future__ import annotations

import re
from typing import Any

from evo.types import Status
from fitness._stage import Job, Stage, StageContext, StageResult

__all__ = ["Resources", "parse_ptxas_report", "ptxas_entries"]

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = "Function properties for {name}"
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[\d+\]")


def ptxas_entries(log: str) -> list[str]:
    """Names of every entry function in a ``ptxas -v`` report, in order."""
    return _ENTRY.findall(log)


def parse_ptxas_report(log: str, entry: str) -> dict[str, int] | None:
    """Resources of ``entry`` from a ``ptxas -v`` report, or ``None`` if it is not there.

    Args:
        log: The compiler's output (stdout and stderr) with ``-v`` / ``-Xptxas -v``.
        entry: The entry function's (unmangled, ``extern "C"``) name.

    Returns:
        ``registers``, ``shared_bytes`` (static shared memory), ``cmem_bytes``,
        ``stack_bytes`` (stack frame), ``spill_store_bytes``, ``spill_load_bytes``,
        ``spill_bytes`` (their sum) and ``barriers``.
    """
    lines = log.splitlines()
    start = None
    for i, line in enumerate(lines):
        m = _ENTRY.search(line)
        if m and m.group(1) == entry:
            start = i
            break
    if start is None:
        return None
    end = len(lines)
    for j in range(start + 1, len(lines)):
        if _ENTRY.search(lines[j]):
            end = j
            break
    section = lines[start:end]
    out: dict[str, Any] = {"registers": 0, "shared_bytes": 0, "cmem_bytes": 0, "stack_bytes": 0,
                           "spill_store_bytes": 0, "spill_load_bytes": 0, "spill_bytes": 0, "barriers": 0}
    props = _PROPS.format(name=entry)
    for k, line in enumerate(section):
        if line.rstrip().endswith(props) and k + 1 < len(section):
            fm = _FRAME.search(section[k + 1])
            if fm:
                out["stack_bytes"], out["spill_store_bytes"], out["spill_load_bytes"] = (int(g) for g in fm.groups())
    for line in section:
        um = _USED.search(line)
        if um:
            out["registers"] = int(um.group(1))
            bm = _BARRIERS.search(line)
            sm = _SMEM.search(line)
            out["barriers"] = int(bm.group(1)) if bm else 0
            out["shared_bytes"] = int(sm.group(1)) if sm else 0
            out["cmem_bytes"] = sum(int(c) for c in _CMEM.findall(line))
            break
    out["spill_bytes"] = out["spill_store_bytes"] + out["spill_load_bytes"]
    return out


class Resources(Stage):
    """Put the entry kernel's registers, shared memory, stack and spills in the resources.

    Reads ``job.data["compile_log"]`` (a ``ptxas -v`` report, written by the Compile
    stage), or with several builds (the Problem's ``dtype_defines``) each build's report in
    ``job.data["compile_logs"]``: each field is then the largest over the builds (what the
    most demanding dtype needs). Resources are data and fail nothing, except when the entry
    is missing from a report: that is ``COMPILE_ERROR`` ("entry X not found in cubin").
    """

    name = "resources"
    where = "host"

    def run(self, job: Job, ctx: StageContext) -> StageResult:
        """Parse the compile log of ``job`` for ``job.genome.entry``."""
        log = job.data.get("compile_log")
        if log is None:
            raise RuntimeError("Resources stage needs job.data['compile_log']: put a Compile stage before it")
        entry = job.genome.entry
        logs = job.data.get("compile_logs") or {"": log}
        out: dict[str, int] = {}
        for name, text in logs.items():
            res = parse_ptxas_report(text, entry)
            if res is None:
                found = ptxas_entries(text)
                listed = ", ".join(found) if found else "none"
                where = f" of build {name}" if name else ""
                return StageResult.fail(Status.COMPILE_ERROR, f"entry {entry} not found in cubin{where} "
                                                              f"(entries in the ptxas report: {listed})")
            for k, v in res.items():
                out[k] = max(out.get(k, v), v)
        return StageResult(ok=True, resources=out)
