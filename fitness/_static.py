"""Static checks: a genome is device code only, and only the device code we allow.

The checks are regex and token based (no compiler front end), run in microseconds and
say exactly which rule a genome broke. They are a policy gate in front of the compiler,
not a proof of safety: the harness still owns every allocation and launch, and the
device stages still poison outputs and check them.

CUDA C++ rules (each one rejects with a reason naming the rule):

``host code``
    ``__host__`` anywhere, a ``main(`` function, or a function *defined* at namespace
    scope (also inside ``namespace`` and ``extern "C"`` blocks) without a
    ``__global__`` or ``__device__`` qualifier. The scan tracks brace depth over the
    source with comments and string literals blanked, so braces in strings and comments
    do not count. Struct/class/union/enum bodies, initialisers (``= {...}``),
    ``namespace`` blocks, templates and ``static __device__`` helpers are allowed.
``CUDA API``
    Calls to the runtime or driver API (``cudaXxx(``, ``cuXxx(``), and the stream and
    event types (``cudaStream_t``, ``cudaEvent_t``, ``CUstream``, ``CUevent``).
``dynamic parallelism``
    A kernel launch ``<<<`` inside the genome.
``library``
    cuBLAS, cuDNN, cuFFT, cuSPARSE, cuSOLVER, NCCL, NVSHMEM, the cuRAND host API
    (``curandXxx``) and Thrust.
``heap / printf``
    ``malloc``, ``calloc``, ``realloc``, ``free``, ``new``, ``delete``, ``printf`` and
    friends (device printf is slow, shares a host buffer, and is not output the harness
    reads).
``token pasting``
    ``##`` outside string literals (it would let a macro assemble a forbidden name the
    other rules cannot see).
``include``
    ``#include`` of a header not in ``problem.allowed_includes``. ``#pragma`` and other
    directives are allowed.
``special register``
    Any of ``problem.forbidden_sregs`` (e.g. ``%clock``, ``%globaltimer``) in the
    source, asm strings included; ``clock()``/``clock64()`` when ``%clock``/``%clock64``
    is forbidden and ``__globaltimer()`` when ``%globaltimer`` is.
``entry``
    The entry must be defined as ``extern "C" __global__ void <entry>(...)`` (either
    with the ``extern "C"`` prefix or inside an ``extern "C" { }`` block;
    ``__launch_bounds__``/``__cluster_dims__`` attributes are allowed).

Raw PTX rules (``language == "ptx"``): no forbidden special register, no ``.extern``
declaration (calls into libraries such as ``vprintf``), and every ``.entry`` is the
genome's entry (at least one).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from evo.types import Genome, Problem, Status
from fitness._stage import Job, Stage, StageContext, StageResult

__all__ = ["StaticCheck", "static_violations"]

_COMMENT_OR_LITERAL = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.DOTALL)

_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\b__host__\b"), "host code: '__host__' is not allowed; the genome is device code only"),
    (re.compile(r"\bmain\s*\("), "host code: a 'main(' function is not allowed; the harness launches the kernel"),
    (re.compile(r"\bcuda[A-Z]\w*\s*\("), "CUDA API: runtime API call '{m}' is not allowed in a genome"),
    (re.compile(r"\bcu[A-Z]\w*\s*\("), "CUDA API: driver API call '{m}' is not allowed in a genome"),
    (re.compile(r"\b(?:cudaStream_t|cudaEvent_t|CUstream|CUevent|CUstream_st|CUevent_st)\b"),
     "CUDA API: streams and events ('{m}') are not allowed; the harness owns the stream"),
    (re.compile(r"<<<"), "dynamic parallelism: kernel launches ('<<<') are not allowed in a genome"),
    (re.compile(r"\b(?:cublas|cudnn|cufft|cusparse|cusolver|nccl|nvshmem)\w*", re.IGNORECASE),
     "library: '{m}' is a library call; write the kernel itself"),
    (re.compile(r"\bcurand[A-Z]\w*"), "library: cuRAND host API '{m}' is not allowed"),
    (re.compile(r"\bthrust\s*::"), "library: Thrust ('{m}') is not allowed; write the kernel itself"),
    (re.compile(r"\b(?:malloc|calloc|realloc|free|printf|vprintf|fprintf|sprintf|puts)\s*\("),
     "heap / printf: '{m}' is not allowed in a genome (no device heap, no printf)"),
    (re.compile(r"\b(?:new|delete)\b"), "heap / printf: '{m}' is not allowed in a genome (no device heap)"),
    (re.compile(r"##"), "token pasting: '##' is not allowed (macros may not assemble identifiers)"),
]

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]*)[>"]?', re.MULTILINE)
_DIRECTIVE = re.compile(r"^[ \t]*#[^\n]*", re.MULTILINE)
_ATTRS = re.compile(r"\b(?:__launch_bounds__|__cluster_dims__|__maxnreg__|__attribute__|alignas|__align__|"
                    r"__declspec)\s*\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)")
_TEMPLATE_PREFIX = re.compile(r"^\s*template\s*<")
_TYPE_KEYWORD = re.compile(r"\b(?:struct|class|union|enum)\b")
_NAMESPACE = re.compile(r"\bnamespace\b[\w\s:]*$")
_EXTERN_C = re.compile(r'\bextern\s*"[^"]*"\s*$')
_IDENT_BEFORE_PAREN = re.compile(r"([A-Za-z_~][\w:]*(?:\s*operator\s*[^\s(]+)?)\s*$")


def _blank(text: str) -> str:
    """Blank comments (to spaces) and the contents of string/char literals (to spaces).

    Lengths and newlines are kept, so offsets in the result match the input.
    """

    def repl(m: re.Match[str]) -> str:
        tok = m.group(0)
        if tok.startswith("/"):
            return re.sub(r"[^\n]", " ", tok)
        if tok == '"C"':
            return tok  # keep extern "C" readable
        q = tok[0]
        return q + re.sub(r"[^\n]", " ", tok[1:-1]) + q

    return _COMMENT_OR_LITERAL.sub(repl, text)


def _strip_comments(text: str) -> str:
    """Remove comments but keep string literals verbatim (asm strings are checked)."""
    def repl(m: re.Match[str]) -> str:
        tok = m.group(0)
        return re.sub(r"[^\n]", " ", tok) if tok.startswith("/") else tok

    return _COMMENT_OR_LITERAL.sub(repl, text)


def _strip_template_prefix(header: str) -> str:
    """Drop a leading ``template <...>`` (nested angle brackets allowed)."""
    while True:
        m = _TEMPLATE_PREFIX.match(header)
        if not m:
            return header
        depth, i = 1, m.end()
        while i < len(header) and depth:
            depth += {"<": 1, ">": -1}.get(header[i], 0)
            i += 1
        header = header[i:]


def _top_level_has(header: str, ch: str) -> bool:
    """Whether ``ch`` occurs in ``header`` outside parentheses and angle/square brackets."""
    depth = 0
    for c in header:
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == ch and depth == 0:
            return True
    return False


@dataclass
class _Function:
    name: str
    header: str
    extern_c: bool


def _scan_namespace_scope(code: str) -> tuple[list[_Function], list[str]]:
    """Walk namespace-scope declarations of blanked ``code``.

    Returns the function definitions found at namespace scope (inside namespace and
    ``extern "C"`` blocks too) and the violations found while scanning.
    """
    functions: list[_Function] = []
    errors: list[str] = []
    scope: list[str] = []  # "ns" or "externc" for each open namespace-like block
    start = 0
    i = 0
    n = len(code)
    while i < n:
        c = code[i]
        if c == ";":
            start = i + 1
        elif c == "}":
            if scope:
                scope.pop()
            start = i + 1
        elif c == "{":
            header = code[start:i].strip()
            if _NAMESPACE.search(header):
                scope.append("ns")
                start = i + 1
            elif _EXTERN_C.search(header):
                scope.append("externc")
                start = i + 1
            else:
                # Skip this block (type body, initialiser or function body).
                depth, j = 1, i + 1
                while j < n and depth:
                    depth += {"{": 1, "}": -1}.get(code[j], 0)
                    j += 1
                body_end = j
                _classify(header, "externc" in scope, functions, errors)
                # A type body or initialiser ends with ';' later; a function body does not.
                i = body_end
                start = body_end
                continue
        i += 1
    return functions, errors


def _classify(header: str, in_extern_c: bool, functions: list[_Function], errors: list[str]) -> None:
    """Decide what a namespace-scope ``header {`` is; record functions and violations."""
    h = _strip_template_prefix(header)
    plain = _ATTRS.sub(" ", h)
    if not plain.strip():
        return
    if _top_level_has(plain, "="):
        return  # initialiser: int x[] = {...};  auto f = [](...) {...};
    paren = plain.find("(")
    kw = _TYPE_KEYWORD.search(plain)
    if kw and (paren < 0 or kw.start() < paren):
        return  # struct / class / union / enum body
    if paren < 0:
        return  # not a function (e.g. a stray block)
    m = _IDENT_BEFORE_PAREN.search(plain[:paren])
    name = m.group(1).split("::")[-1].strip() if m else "?"
    qualifiers = set(re.findall(r"\b__\w+__\b", plain[:paren]))
    if not qualifiers & {"__global__", "__device__"}:
        short = " ".join(header.split())[:120]
        errors.append(f"host code: function '{name}' is defined at namespace scope without __device__ or "
                      f"__global__ (`{short}`); mark helpers `static __device__` or `__device__`")
        return
    functions.append(_Function(name=name, header=plain, extern_c=in_extern_c or bool(re.search(r'\bextern\s*"C"',
                                                                                                 plain))))


def _entry_ok(functions: Sequence[_Function], entry: str) -> bool:
    for f in functions:
        if f.name != entry or not f.extern_c:
            continue
        before = f.header[: f.header.find("(")]
        if re.search(r"\b__global__\b", before) and re.search(r"\bvoid\b", before):
            return True
    return False


def _sreg_pattern(sreg: str) -> re.Pattern[str]:
    return re.compile(re.escape(sreg) + r"(?![\w$])")


def static_violations(source: str, *, language: str = "cuda", entry: str = "kernel",
                      allowed_includes: Sequence[str] = (), forbidden_sregs: Sequence[str] = ()) -> list[str]:
    """Every static rule ``source`` breaks (empty when it passes).

    Args:
        source: CUDA C++ (with inline PTX) or raw PTX.
        language: ``"cuda"`` or ``"ptx"``.
        entry: The kernel's entry-point name.
        allowed_includes: Headers the genome may ``#include``.
        forbidden_sregs: Special registers (``"%clock"``, ...) the genome may not read.

    Returns:
        Human-readable reasons, one per broken rule instance, in source order of rules.
    """
    if language == "ptx":
        return _ptx_violations(source, entry, forbidden_sregs)
    errors: list[str] = []
    joined = source.replace("\\\n", " ")
    no_comments = _strip_comments(joined)
    blank = _blank(joined)

    for m in _INCLUDE.finditer(no_comments):
        header = m.group(2).strip()
        if header not in allowed_includes:
            errors.append(f"include: '#include {header}' is not allowed (allowed: {', '.join(allowed_includes)})")

    code = _DIRECTIVE.sub(lambda m: "" if re.match(r"\s*#\s*define\b", m.group(0)) is None else m.group(0), blank)
    for pattern, message in _RULES:
        for m in pattern.finditer(code):
            errors.append(message.format(m=" ".join(m.group(0).split())))
            break

    for sreg in forbidden_sregs:
        if _sreg_pattern(sreg).search(no_comments):
            errors.append(f"special register: '{sreg}' is forbidden in this problem (timers and counters "
                          f"may not be read by a genome)")
    builtin_of = {"%clock": r"\bclock\s*\(", "%clock64": r"\bclock64\s*\(", "%globaltimer": r"\b__globaltimer\s*\("}
    for sreg, pat in builtin_of.items():
        if sreg in forbidden_sregs and re.search(pat, code):
            errors.append(f"special register: the builtin reading '{sreg}' is forbidden in this problem")

    body_code = _DIRECTIVE.sub("", blank)
    functions, scan_errors = _scan_namespace_scope(body_code)
    errors.extend(scan_errors)
    if not _entry_ok(functions, entry):
        errors.append(f"entry: no definition of `extern \"C\" __global__ void {entry}(...)` found; the entry "
                      f"must be an extern \"C\" __global__ void function named {entry!r}")
    return errors


def _ptx_violations(source: str, entry: str, forbidden_sregs: Sequence[str]) -> list[str]:
    errors: list[str] = []
    code = re.sub(r"//[^\n]*|/\*.*?\*/", " ", source, flags=re.DOTALL)
    for sreg in forbidden_sregs:
        if _sreg_pattern(sreg).search(code):
            errors.append(f"special register: '{sreg}' is forbidden in this problem")
    ext = re.search(r"^\s*\.extern\b[^\n]*", code, re.MULTILINE)
    if ext:
        errors.append(f"library: external declarations are not allowed in PTX genomes (`{ext.group(0).strip()}`)")
    entries = re.findall(r"\.entry\s+([A-Za-z_$%][\w$]*)", code)
    if entry not in entries:
        errors.append(f"entry: no `.entry {entry}` in the PTX")
    others = sorted({e for e in entries if e != entry})
    if others:
        errors.append(f"entry: only `.entry {entry}` is allowed, found also {', '.join(others)}")
    return errors


class StaticCheck(Stage):
    """Reject genomes that are not device code only (see the module docstring for the rules).

    A rejection is ``Status.REJECTED`` with every broken rule in the ``"reason"``
    artifact (one per line).
    """

    name = "static"
    where = "host"

    def run(self, job: Job, ctx: StageContext) -> StageResult:
        """Check ``job.genome`` against ``job.problem``'s includes and special registers."""
        reasons = check_genome(job.genome, job.problem)
        if reasons:
            return StageResult.fail(Status.REJECTED, "\n".join(reasons))
        return StageResult(ok=True)


def check_genome(genome: Genome, problem: Problem) -> list[str]:
    """:func:`static_violations` for a genome under a problem's policy."""
    return static_violations(genome.source, language=genome.language, entry=genome.entry,
                             allowed_includes=problem.allowed_includes, forbidden_sregs=problem.forbidden_sregs)
