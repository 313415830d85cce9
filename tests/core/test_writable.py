"""``writable.folder_problem``: what stops a folder being written, found by trying, creating nothing."""

from __future__ import annotations

import os

from lossscale_bench.core.writable import folder_problem


def test_a_folder_that_can_be_written_or_made(tmp_path):
    assert folder_problem(tmp_path) is None
    assert folder_problem(tmp_path / "a" / "b") is None
    assert list(tmp_path.iterdir()) == []  # judged, not made; the probe file is gone


def test_a_file_where_a_folder_should_be(tmp_path):
    (tmp_path / "f").write_text("x")
    assert folder_problem(tmp_path / "f") == "is a file, not a folder"
    assert folder_problem(tmp_path / "f" / "sub") == f"cannot be created: {tmp_path / 'f'} is a file, not a folder"


def test_a_broken_symbolic_link(tmp_path):
    os.symlink(tmp_path / "gone", tmp_path / "link")
    assert folder_problem(tmp_path / "link").startswith("is a broken symbolic link")
    assert (
        folder_problem(tmp_path / "link" / "x") == f"cannot be created: {tmp_path / 'link'} is a broken symbolic link"
    )


def test_relative_paths_are_taken_from_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f").write_text("x")
    assert folder_problem("f") == "is a file, not a folder"
    assert folder_problem("reports") is None
