"""What an engine run actually took to be fast, for the manifest's `run.speed_path`.

A speed path can change numbers (a compiled block keeps fp32 where eager rounds to bf16; each
SDPA kernel sums in its own order) and can fall back without a word (a kernel that declines a
call, a compile that fails). A dump that does not say which path ran cannot tell "the engine
drifted" from "the engine ran another route this time", so the engine notes here, as it runs,
what it asked for, what ran and every fallback with its reason, and writes it with the run.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpeedPath:
    # attention kernels that ran, by name ("flash", "math", ...), with the calls the host made
    # (a replayed CUDA graph runs its captured calls again without counting them)
    attention: dict[str, int] = field(default_factory=dict)
    # each silent change of route, once per (what, why): {"what": "sdpa flash -> math", "why": ...}
    fallbacks: list[dict[str, str]] = field(default_factory=list)
    # per model part: {"policy": "auto", "ran": "eager"}-style facts the model's engine fills in
    parts: dict[str, dict] = field(default_factory=dict)

    def kernel(self, name: str) -> None:
        self.attention[name] = self.attention.get(name, 0) + 1

    def fallback(self, what: str, why: str) -> None:
        entry = {"what": what, "why": why}
        if entry not in self.fallbacks:
            self.fallbacks.append(entry)

    def as_json(self) -> dict:
        return {**self.parts, "attention": {"sdpa": dict(sorted(self.attention.items()))},
                "fallbacks": list(self.fallbacks)}
