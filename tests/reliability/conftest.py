"""The reliability campaign: bounded hypothesis settings and a tally of what it tried.

Every property counts the cases it ran (``tally.case(name)``), fault tests count the faults they
injected (``tally.fault(name)``); the totals are printed at the end of the session, so the figures
in the campaign's note come from the run itself.
"""

from __future__ import annotations

import collections
import os

import pytest
from hypothesis import HealthCheck, settings

collect_ignore = ["raises_at_import.py"]

# Bounded so the whole campaign stays well under 3 minutes on 2 shared cores; raise with
# OMNIPROF_FUZZ_EXAMPLES for a longer local campaign.
MAX_EXAMPLES = int(os.environ.get("OMNIPROF_FUZZ_EXAMPLES", "150"))
settings.register_profile("omniprof-reliability", max_examples=MAX_EXAMPLES, deadline=None, derandomize=False,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                 HealthCheck.function_scoped_fixture])
FUZZ = settings.get_profile("omniprof-reliability")


class Tally:
    """Counts per property (cases) and per fault kind (injections), and the outcomes seen."""

    def __init__(self) -> None:
        self.cases: collections.Counter[str] = collections.Counter()
        self.outcomes: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.faults: collections.Counter[str] = collections.Counter()
        self.figures: dict[str, str] = {}
        self.checks: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)

    def case(self, prop: str, outcome: str = "ok") -> None:
        self.cases[prop] += 1
        self.outcomes[prop][outcome] += 1

    def check(self, name: str, outcome: str) -> None:
        """A case of a non-property test (limits, load, security)."""
        self.checks[name][outcome] += 1

    def fault(self, kind: str) -> None:
        self.faults[kind] += 1

    def figure(self, name: str, text: str) -> None:
        self.figures[name] = text


TALLY = Tally()


@pytest.fixture
def tally() -> Tally:
    return TALLY


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not (TALLY.cases or TALLY.faults or TALLY.figures or TALLY.checks):
        return
    tr = terminalreporter
    tr.section("omniprof reliability campaign")
    if TALLY.cases:
        tr.write_line(f"fuzz properties: {len(TALLY.cases)}, cases tried: {sum(TALLY.cases.values())}")
        for prop, n in sorted(TALLY.cases.items()):
            kinds = ", ".join(f"{k} {c}" for k, c in TALLY.outcomes[prop].most_common())
            tr.write_line(f"  {prop}: {n} cases ({kinds})")
    if TALLY.checks:
        tr.write_line(f"other checks: {sum(sum(c.values()) for c in TALLY.checks.values())}")
        for name, outcomes in sorted(TALLY.checks.items()):
            tr.write_line(f"  {name}: " + ", ".join(f"{k} {n}" if n > 1 else k for k, n in outcomes.most_common()))
    if TALLY.faults:
        tr.write_line(f"faults injected: {sum(TALLY.faults.values())}")
        for kind, n in sorted(TALLY.faults.items()):
            tr.write_line(f"  {kind}: {n}")
    for name, text in sorted(TALLY.figures.items()):
        tr.write_line(f"{name}: {text}")
