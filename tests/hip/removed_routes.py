"""The router routes hip/README.md records as removed, with their former codes: what the tests ask
for to prove a removed route is refused with one line, never run nor quietly re-added."""
from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "hip" / "README.md"


def removed_router_routes() -> list[tuple[str, int]]:
    """(name, former threads_per_row code) of each route the README's "Removed routes" line names."""
    lines = [line for line in README.read_text().splitlines() if line.startswith("Removed routes")]
    assert len(lines) == 1, "hip/README.md keeps one 'Removed routes' line (the record of what was dropped, and why)"
    found = [(name, int(code)) for name, code in re.findall(r"`(\w+)` \((-\d+)\)", lines[0])]
    assert found, lines[0]
    return found
