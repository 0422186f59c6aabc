"""Several runs of the rank program (`python -m engine.deepseek_v41_flash.distributed ARGS`) in one
torchrun launch, for the tests: each launch costs a Python + torch start-up per rank and one for
the agent (about 3 s at 2 ranks on the 2-core CI machine), the runs themselves a fraction of that.

    torchrun --standalone --nproc-per-node W tests/engine/deepseek_v41_flash/rank_scenarios.py PLAN.json

PLAN.json: a list of {"world": N, "argv": [...]}, N at most W. Ranks 0..N-1 run the module as
`-m` would (`runpy`, as `__main__`, with its own sys.argv, RANK and WORLD_SIZE: a run of N ranks
sees exactly what a launch of N would give it); the ranks past N skip that run. Each rank's exit
status goes to `<its --out>.rc.rank<r>`, its output to `<its --out>.log.rank<r>`. Every run gets
a process group of its own: rank 0 hosts a fresh store on a free port for it and hands the port
on through the agent's store (a second process group on the agent's store would read the first
one's stale addresses). A run that raises ends the launch, as it would end its own.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import runpy
import socket
import sys
from pathlib import Path

from torch.distributed import TCPStore


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _out(argv: list[str]) -> Path:
    return Path(argv[argv.index("--out") + 1])


def main(plan_file: str) -> int:
    plan = json.loads(Path(plan_file).read_text())
    rank = int(os.environ["RANK"])
    agent = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                     timeout=datetime.timedelta(seconds=300))
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"  # rank 0 hosts each run's own store
    for i, run in enumerate(plan):
        if rank >= run["world"]:
            continue
        argv = run["argv"]
        key = f"rank-scenarios/{i}/port"
        if rank == 0:
            agent.set(key, str(_free_port()))
        os.environ.update(MASTER_PORT=agent.get(key).decode(), WORLD_SIZE=str(run["world"]),
                          LOCAL_WORLD_SIZE=str(run["world"]))
        out = _out(argv)
        out.parent.mkdir(parents=True, exist_ok=True)
        sys.argv = ["engine.deepseek_v41_flash.distributed", *argv]
        with open(f"{out}.log.rank{rank}", "w") as log, contextlib.redirect_stdout(log), \
                contextlib.redirect_stderr(log):
            try:
                runpy.run_module("engine.deepseek_v41_flash.distributed", run_name="__main__", alter_sys=True)
                rc = 0
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        Path(f"{out}.rc.rank{rank}").write_text(str(rc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
