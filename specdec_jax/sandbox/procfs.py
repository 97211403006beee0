"""What ``/proc`` says about processes: thread counts per user, live process-group members."""

from __future__ import annotations

import os


def pids() -> list[str]:
    """The process ids in /proc, [] without a /proc."""
    try:
        return [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:  # no /proc
        return []


def threads_of_user(uid: int) -> int:
    """Threads the user runs now: RLIMIT_NPROC counts them all, not only ours."""
    total = 0
    for pid in pids():
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                total += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:  # it ended while we looked
            pass
    return total


def live_group_members(pgid: int) -> list[str]:
    """Processes in group ``pgid`` that are not zombies (from /proc/<pid>/stat)."""
    members = []
    for pid in pids():
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
                state, _, group = f.read().rpartition(")")[2].split()[:3]  # name may hold ")"
        except (OSError, ValueError):
            continue
        if int(group) == pgid and state not in ("Z", "X"):
            members.append(pid)
    return members
