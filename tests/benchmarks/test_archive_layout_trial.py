"""The layout trial writes what each layout says, into real LMDB files (small, quick)."""

from __future__ import annotations

import sys
from pathlib import Path

import lmdb
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import archive_layout_trial as trial  # noqa: E402


@pytest.mark.parametrize("layout", trial.LAYOUTS)
def test_each_layout_runs_and_reports_rate_and_disk(tmp_path: Path, layout: str) -> None:
    items = trial.make_items(60, 9000)
    res = trial.run(layout, items, tmp_path / layout, batch=25)
    assert res["records_per_s"] > 0
    assert res["disk_bytes_per_record"] >= 9000 * 0.9  # the bytes really went to the file
    assert not (tmp_path / layout).exists()  # cleaned up


def test_seqtail_stores_every_byte_in_head_and_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    items = trial.make_items(30, 9000)
    monkeypatch.setattr(trial.shutil, "rmtree", lambda *a, **k: None)  # keep the file to read it back
    trial.run("seqtail", items, tmp_path / "st", batch=7)
    env = lmdb.open(str(tmp_path / "st"), max_dbs=4, readonly=True, lock=False)
    rec, idx, tail = env.open_db(b"records", create=False), env.open_db(b"index", create=False), \
        env.open_db(b"tails", create=False)
    with env.begin() as txn:
        for k, v in items:
            s = txn.get(k, db=idx)
            assert txn.get(s, db=rec) + txn.get(s, db=tail) == v
            assert len(txn.get(s, db=rec)) == trial.HEAD
    env.close()
