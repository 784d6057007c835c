"""Run directories: where a session's files go, and what they are called.

A session with a ``logdir`` is saved in XProf's layout, ``<logdir>/plugins/profile/<run>/``, as
:data:`RESULT_FILENAME` beside the backends' native artifacts (while it records, checkpoints write
:data:`PARTIAL_FILENAME` there). In a distributed run, rank 0 names ``<run>`` once for the whole
job and rank ``N`` works in ``<run>/rank<N>/``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from omniprof.core.fileio import unique_run_dir

__all__ = ["RESULT_FILENAME", "PARTIAL_FILENAME", "RANK_DIR_PREFIX", "profile_root", "new_session_dir",
           "rank_dir", "name_job_run"]

RESULT_FILENAME = "omniprof.result.json"
#: Written in the session directory while recording and replaced by RESULT_FILENAME at the end;
#: a run killed without warning (SIGKILL, OOM killer, power) leaves this readable partial result.
PARTIAL_FILENAME = "omniprof.partial.json"
#: rank N's part of a run lives in ``<run>/rank<N>/``.
RANK_DIR_PREFIX = "rank"


def profile_root(logdir: str | os.PathLike[str]) -> Path:
    """``<logdir>/plugins/profile``: the folder XProf lists runs from."""
    return Path(logdir) / "plugins" / "profile"


def new_session_dir(logdir: str | os.PathLike[str]) -> Path:
    """A new, empty run directory ``<logdir>/plugins/profile/<run>`` for one session."""
    return unique_run_dir(profile_root(logdir), flag="--logdir DIR")


def rank_dir(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """``<run>/rank<N>``: where rank ``N``'s part of a distributed run lives."""
    return Path(run_dir) / f"{RANK_DIR_PREFIX}{rank}"


def name_job_run(logdir: str | os.PathLike[str] | None, rank: int,
                 agree: Callable[[str | None], str | None]) -> tuple[str | None, Path | None, Path | None]:
    """Rank 0 names the run directory once for the whole job; rank ``N`` works in ``<run>/rank<N>``.

    ``agree`` sends rank 0's name to every rank (each passes its own: a name on rank 0, None on the
    others) and returns it. Returns ``(name, run_dir, session_dir)``; the directories are None
    without a ``logdir`` (or a name), and the session directory exists.
    """
    base = profile_root(logdir) if logdir is not None else None
    mine = unique_run_dir(base).name if base is not None and rank == 0 else None
    name = agree(mine)
    if base is None or name is None:
        return name, None, None
    run_dir = base / name
    session_dir = rank_dir(run_dir, rank)
    session_dir.mkdir(parents=True, exist_ok=True)
    return name, run_dir, session_dir
