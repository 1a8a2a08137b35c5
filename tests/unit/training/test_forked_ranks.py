"""Ranks forked from the warm agent start together: none begins (and connects to the store)
while a sibling is still being forked (`worker.await_siblings`)."""

from __future__ import annotations

import os
import tempfile
import threading

from hetflow.training.worker import await_siblings


def test_a_forked_rank_waits_until_every_rank_of_its_round_is_forked(tmp_path, monkeypatch):
    job = tmp_path / "job.json"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    folder = tmp_path / "forks" / f"{os.getppid()}-3"
    sibling = threading.Timer(0.2, lambda: (folder / "1").touch())
    sibling.start()
    await_siblings(["--job", str(job)], timeout_s=60)
    assert sorted(p.name for p in folder.iterdir()) == ["0", "1"]  # it returned after rank 1
    sibling.join()


def test_a_rank_whose_sibling_never_comes_starts_after_its_wait(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_RANK", "2")
    await_siblings(["--job", str(tmp_path / "job.json")], timeout_s=0.05)
    (folder,) = (tmp_path / "forks").iterdir()
    assert [p.name for p in folder.iterdir()] == ["2"]


def test_a_rank_alone_does_not_wait(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    await_siblings(["--job", str(tmp_path / "job.json")], timeout_s=60)
    assert not (tmp_path / "forks").exists()


def test_a_rank_without_a_job_file_meets_its_siblings_in_the_temporary_folder(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    await_siblings([], timeout_s=0.05)
    (folder,) = (tmp_path / "forks").iterdir()
    assert [p.name for p in folder.iterdir()] == ["1"]
