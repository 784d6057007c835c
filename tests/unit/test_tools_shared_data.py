"""tests.tools.shared_data: where the shared data folder is looked for, in order, and the failure
(never a skip) that names where it looked and the fix when the file is in none of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import tools

NAME = ("kineto", "alexnet_cuda_trace.json.gz")


def _put(data_dir: Path) -> Path:
    path = data_dir / "kineto" / "alexnet_cuda_trace.json.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"trace")
    return path


@pytest.fixture
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A repository at top/wt/repo in tmp_path, with no shared/ folder yet and no OMNIPROF_SHARED_DATA."""
    repo = tmp_path / "top" / "wt" / "repo"
    repo.mkdir(parents=True)
    monkeypatch.setattr(tools, "ROOT", repo)
    monkeypatch.delenv("OMNIPROF_SHARED_DATA", raising=False)
    return {"env": tmp_path / "elsewhere" / "data", "beside": tmp_path / "top" / "wt" / "shared" / "data",
            "worktree": tmp_path / "top" / "shared" / "data"}


def test_beside_the_repository(layout):
    """shared/data beside the repository root is found."""
    expected = _put(layout["beside"])
    assert tools.shared_data(*NAME) == expected


def test_one_level_further_up_from_a_worktree(layout):
    """shared/data two levels above the repository root (a worktree under wt/) is found."""
    expected = _put(layout["worktree"])
    assert tools.shared_data(*NAME) == expected


def test_beside_comes_before_one_level_up(layout):
    """With both, the folder beside the repository wins."""
    _put(layout["worktree"])
    expected = _put(layout["beside"])
    assert tools.shared_data(*NAME) == expected


def test_the_variable_comes_first(layout, monkeypatch):
    """OMNIPROF_SHARED_DATA is looked in before the folders beside the repository."""
    _put(layout["beside"])
    _put(layout["worktree"])
    monkeypatch.setenv("OMNIPROF_SHARED_DATA", str(layout["env"]))
    expected = _put(layout["env"])
    assert tools.shared_data(*NAME) == expected


def test_a_variable_without_the_file_falls_through(layout, monkeypatch):
    """OMNIPROF_SHARED_DATA naming a folder without the file: the folders beside the repository are looked in."""
    layout["env"].mkdir(parents=True)
    monkeypatch.setenv("OMNIPROF_SHARED_DATA", str(layout["env"]))
    expected = _put(layout["worktree"])
    assert tools.shared_data(*NAME) == expected


def test_a_folder_without_the_file_is_passed_over(layout):
    """A shared/data folder beside the repository that lacks the file does not stop the search."""
    (layout["beside"] / "kineto").mkdir(parents=True)
    expected = _put(layout["worktree"])
    assert tools.shared_data(*NAME) == expected


def test_not_found_fails_naming_where_it_looked_and_the_fix(layout, monkeypatch):
    """An empty OMNIPROF_SHARED_DATA and no shared/ folder: the test fails (not skips) with one message
    that names the file, every folder looked in, and both fixes."""
    layout["env"].mkdir(parents=True)
    monkeypatch.setenv("OMNIPROF_SHARED_DATA", str(layout["env"]))
    assert tools.find_shared_data(*NAME) is None
    with pytest.raises(pytest.fail.Exception) as info:
        tools.shared_data(*NAME)
    message = str(info.value)
    assert message.startswith("kineto/alexnet_cuda_trace.json.gz not found")
    looked = [message.index(str(layout[k])) for k in ("env", "beside", "worktree")]
    assert looked == sorted(looked)
    assert ("put the project's shared/ folder beside the repository, or set "
            "OMNIPROF_SHARED_DATA=/path/to/shared/data") in message
