"""The router routes that were removed, with their former codes: what the tests ask for to prove a
removed route is refused with one line, never run nor quietly re-added. Each lost to a kept route
at every measured size (hip/README.md, "Router routes"); their codes stay unused and are refused."""
from __future__ import annotations

# (name, former threads_per_row code)
REMOVED_ROUTER_ROUTES: tuple[tuple[str, int], ...] = (
    ("group16", -3),
    ("group16_lb", -4),
    ("group32", -5),
    ("filter_table", -8),
    ("filter_table_g16", -9),
    ("filter_table_g16_count", -10),
    ("filter_g16_count", -12),
)


def removed_router_routes() -> list[tuple[str, int]]:
    """(name, former threads_per_row code) of each removed route."""
    return list(REMOVED_ROUTER_ROUTES)
