"""Importing the packages loads no heavy optional dependency."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ["cupy", "openai", "anthropic", "ray", "matplotlib", "rich", "torch"]


def test_import_is_light() -> None:
    code = ("import json, sys, evo, archive, operators, fitness, evo.cli, evo.codec; "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) == []


def test_archive_defers_networkx() -> None:
    code = "import sys, archive; print('networkx' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"
