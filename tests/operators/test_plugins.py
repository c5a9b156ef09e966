"""The plug-in example of docs/plugins.md, plugged in the three documented ways.

The operator's module and the plug-in's pyproject.toml are taken verbatim from the
documentation page, so the page cannot drift from what works.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import textwrap
import types
import zipfile
from pathlib import Path

import pytest

import operators
from evo.types import Genome
from operators import OperatorError, Proposal, UnknownOperatorError, register, resolve, unregister
from operators.testing import CONTRACT_SOURCE, OperatorContract, contract_problem, make_context, make_record

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"

V4_SOURCE = r"""
extern "C" __global__ void kernel(const float4* __restrict__ x, float4* __restrict__ y, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 a;
        asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(a.x), "=f"(a.y), "=f"(a.z), "=f"(a.w) : "l"(x + i));
        float4 b;
        asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(b.x), "=f"(b.y), "=f"(b.z), "=f"(b.w) : "l"(x + n4 - 1 - i));
        y[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
    }
}
"""


def doc_files() -> dict[str, str]:
    """The files of docs/plugins.md: a ``<!-- file: NAME -->`` line, then a fenced block."""
    text = DOC.read_text()
    found = re.findall(r"<!-- file: (\S+) -->\s*```\w*\n(.*?)```", text, re.DOTALL)
    return dict(found)


def _load_doc_module() -> types.ModuleType:
    mod = types.ModuleType("evo_toggle_plugin_doc")
    mod.__file__ = str(DOC)
    exec(compile(doc_files()["evo_toggle_plugin.py"], str(DOC), "exec"), mod.__dict__)
    return mod


toggle_doc = _load_doc_module()
ToggleHint = toggle_doc.ToggleHint


def _parent(source: str = V4_SOURCE):
    return make_record(Genome(source, {"THREADS": 256, "VEC": 4, "UNROLL": 2, "FAST": False}))


def test_doc_has_both_files():
    files = doc_files()
    assert set(files) == {"evo_toggle_plugin.py", "pyproject.toml"}
    assert 'toggle_hint = "evo_toggle_plugin:ToggleHint"' in files["pyproject.toml"]
    assert '[project.entry-points."evo.operators"]' in files["pyproject.toml"]


def test_toggle_hint_toggles_both_ways():
    prob = contract_problem()
    op = ToggleHint()
    (child,) = op.propose([_parent()], make_context(prob, 0))
    assert isinstance(child, Proposal)
    assert child.genome.source.count("ld.global.nc.L1::no_allocate.v4.f32") == 2
    assert "ld.global.nc.v4" not in child.genome.source
    assert child.note == "ld.global.nc +L1::no_allocate (2 loads)"
    assert child.genome.params == _parent().genome.params
    (back,) = op.propose([make_record(child.genome)], make_context(prob, 0))
    assert back.genome.id == _parent().genome.id and back.note.startswith("ld.global.nc -L1::no_allocate")
    with pytest.raises(OperatorError, match="no ld.global.nc load"):
        op.propose([_parent("__global__ void kernel() {}")], make_context(prob, 0))


# --------------------------------------------------------------------------- (a) an instance


def test_a_pass_an_instance():
    inst = ToggleHint()
    op = resolve(inst)
    assert op is inst and op.name == "toggle_hint" and op.n_parents == 1
    (child,) = op.propose([_parent()], make_context(contract_problem(), 0))
    assert "L1::no_allocate" in child.genome.source


# --------------------------------------------------------------------------- (b) a registered name


def test_b_register_a_name():
    assert "toggle_hint" not in operators.available()  # nothing installed it in this process
    with pytest.raises(UnknownOperatorError):
        resolve("toggle_hint")
    operators.register("toggle_hint", ToggleHint)
    try:
        assert "toggle_hint" in operators.available()
        op = resolve("toggle_hint")
        assert isinstance(op, ToggleHint)
        (child,) = op.propose([_parent()], make_context(contract_problem(), 0))
        assert "L1::no_allocate" in child.genome.source
    finally:
        unregister("toggle_hint")
    assert "toggle_hint" not in operators.available()


# --------------------------------------------------------------------------- (c) an installed distribution


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_wheel(project: Path, out: Path) -> Path:
    """A pure-Python wheel of ``project`` (its pyproject's name, version, entry points, py-modules).

    Written here so the test needs neither network nor the ``wheel`` package; pip then
    installs it like any other wheel.
    """
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    meta = tomllib.loads((project / "pyproject.toml").read_text())
    proj = meta["project"]
    name, version = proj["name"], proj["version"]
    dist = re.sub(r"[-_.]+", "_", name)
    info = f"{dist}-{version}.dist-info"
    files: dict[str, bytes] = {}
    for mod in meta["tool"]["setuptools"]["py-modules"]:
        files[f"{mod}.py"] = (project / f"{mod}.py").read_bytes()
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {d}" for d in proj.get("dependencies", [])]
    files[f"{info}/METADATA"] = ("\n".join(lines) + "\n").encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: tests.operators\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    eps = "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n"
                  for group, entries in proj.get("entry-points", {}).items())
    files[f"{info}/entry_points.txt"] = eps.encode()
    record = [_record_line(p, d) for p, d in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = out / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in files.items():
            z.writestr(p, d)
    return wheel


@pytest.fixture
def plugin_project(tmp_path: Path) -> Path:
    project = tmp_path / "evo-toggle-plugin"
    project.mkdir()
    for fname, text in doc_files().items():
        (project / fname).write_text(text)
    return project


def _pip_install(target: Path, what: list[str]) -> None:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
                           "--target", str(target), *what], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, f"pip failed:\n{proc.stdout}\n{proc.stderr}"


RESOLVE_IN_CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import operators
    from evo.types import Genome, Evaluation, Record, Status
    from operators.testing import contract_problem, make_context
    print("available:", "toggle_hint" in operators.available())
    op = operators.resolve("toggle_hint")
    print("resolved:", type(op).__module__, type(op).__name__, op.name, op.n_parents)
    src = sys.stdin.read()
    parent = Record(Genome(src, {"THREADS": 256, "VEC": 4, "UNROLL": 2, "FAST": False}),
                    Evaluation(Status.OK, fitness=1.0))
    (child,) = op.propose([parent], make_context(contract_problem(), 0))
    print("note:", child.note)
""")


def _run_child(pythonpath: list[Path]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(p) for p in pythonpath] + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, "-c", RESOLVE_IN_CHILD], input=V4_SOURCE, capture_output=True, text=True,
                          timeout=60, env=env)


def test_c_entry_point_of_an_installed_distribution(plugin_project: Path, tmp_path: Path):
    wheel = build_wheel(plugin_project, tmp_path)
    target = tmp_path / "site"
    _pip_install(target, [str(wheel)])
    assert (target / "evo_toggle_plugin.py").is_file()
    ep_files = list(target.glob("evo_toggle_plugin-0.1.0.dist-info/entry_points.txt"))
    assert ep_files and "toggle_hint = evo_toggle_plugin:ToggleHint" in ep_files[0].read_text()

    found = _run_child([target])
    assert found.returncode == 0, found.stderr
    assert "available: True" in found.stdout
    assert "resolved: evo_toggle_plugin ToggleHint toggle_hint 1" in found.stdout
    assert "note: ld.global.nc +L1::no_allocate (2 loads)" in found.stdout

    # without the installed distribution on the path the name is unknown
    missing = _run_child([])
    assert missing.returncode != 0 and "unknown operator 'toggle_hint'" in missing.stderr


def _can_build_with_setuptools() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    if (major, minor) >= (70, 1):
        return True
    try:
        import wheel  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _can_build_with_setuptools(), reason="needs setuptools>=70.1 or the 'wheel' package "
                    "to build offline (the hand-built wheel test covers discovery)")
def test_c_pip_builds_the_documented_project(plugin_project: Path, tmp_path: Path):
    target = tmp_path / "site"
    env_args = ["--no-build-isolation", str(plugin_project)]
    _pip_install(target, env_args)
    found = _run_child([target])
    assert found.returncode == 0, found.stderr
    assert "resolved: evo_toggle_plugin ToggleHint toggle_hint 1" in found.stdout


EXTRA_MODULE = textwrap.dedent('''
    from operators import Operator, Proposal

    class FlipFast(Operator):
        name = "flip_fast"

        def propose(self, parents, ctx):
            g = parents[0].genome
            return [Proposal(g.with_params(FAST=not g.params["FAST"]), note="FAST flipped")]

    TOGGLE = FlipFast()

    def make_toggle():
        return FlipFast()

    def toggle(parents, ctx):
        return FlipFast().propose(parents, ctx)
''')


def test_entry_points_may_name_instances_factories_and_functions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    site = tmp_path / "site"
    info = site / "evo_ep_kinds-0.1.dist-info"
    info.mkdir(parents=True)
    (site / "evo_ep_kinds.py").write_text(EXTRA_MODULE)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: evo-ep-kinds\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[evo.operators]\n"
        "ep_class = evo_ep_kinds:FlipFast\n"
        "ep_instance = evo_ep_kinds:TOGGLE\n"
        "ep_factory = evo_ep_kinds:make_toggle\n"
        "ep_function = evo_ep_kinds:toggle\n"
        "ep_broken = evo_ep_kinds:does_not_exist\n"
        "param_random = evo_ep_kinds:FlipFast\n"
    )
    assert "ep_class" not in operators.available()
    monkeypatch.syspath_prepend(str(site))  # also invalidates the import caches
    monkeypatch.delitem(sys.modules, "evo_ep_kinds", raising=False)
    try:
        names = operators.available()
        assert {"ep_class", "ep_instance", "ep_factory", "ep_function", "ep_broken"} <= set(names)
        mod = __import__("evo_ep_kinds")
        assert resolve("ep_instance") is mod.TOGGLE
        for name in ("ep_class", "ep_factory", "ep_function"):
            op = resolve(name)
            assert op.name == name, (name, op)
            prob = contract_problem()
            (child,) = op.propose([_parent()], make_context(prob, 0))
            assert child.genome.params["FAST"] is True
        with pytest.raises(ImportError, match=r"ep_broken = evo_ep_kinds:does_not_exist of distribution evo-ep-kinds"):
            resolve("ep_broken")
        # built-in names win over a plug-in that reuses them
        assert isinstance(resolve("param_random"), operators.ParamRandom)
    finally:
        sys.modules.pop("evo_ep_kinds", None)


# --------------------------------------------------------------------------- the hint is valid PTX


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_toggled_child_compiles_for_sm90a(tmp_path: Path):
    (child,) = ToggleHint().propose([_parent()], make_context(contract_problem(), 0))
    cubins = []
    for tag, src in (("parent", V4_SOURCE), ("child", child.genome.source),
                     ("broken", child.genome.source.replace(".v4.f32 {%0, %1, %2, %3}", ".v2.f32 {%0, %1, %2, %3}"))):
        cu = tmp_path / f"{tag}.cu"
        cu.write_text(src)
        out = tmp_path / f"{tag}.cubin"
        proc = subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-o", str(out), str(cu)],
                              capture_output=True, text=True, timeout=120)
        if tag == "broken":  # the check can fail: a malformed load is refused by ptxas
            assert proc.returncode != 0 and "ld" in proc.stderr
        else:
            assert proc.returncode == 0, proc.stderr
            cubins.append(out.read_bytes())
    assert cubins[0] != cubins[1]


# --------------------------------------------------------------------------- the contract suite


class TestToggleHintContract(OperatorContract):
    def make_operator(self):
        return ToggleHint()

    def make_source(self):
        return CONTRACT_SOURCE.replace("ld.global.nc.f32", "ld.global.nc.L1::no_allocate.f32")


def test_register_decorator_form_from_the_doc():
    deco = register("toggle_hint_deco")
    try:
        assert deco(ToggleHint) is ToggleHint
        assert isinstance(resolve("toggle_hint_deco"), ToggleHint)
    finally:
        unregister("toggle_hint_deco")
