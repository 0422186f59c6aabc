"""The tensor- and expert-parallel engine (engine/deepseek_v41_flash/distributed.py): its slices
add up to the unsharded layers, torchrun runs at 2 and 4 ranks (gloo, CPU) merge and match the
unsharded oracle, and each sharded fault is named at its boundary with its rank."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import engine.backend as backends
from engine.deepseek_v41_flash.distributed import FAULTS, Parallel
from engine.deepseek_v41_flash.attention import Attention, ChunkShared
from engine.deepseek_v41_flash.model import LanguageModel
from engine.deepseek_v41_flash.moe import MoE
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.models.deepseek_v41_flash.synthetic_language import tiny_language_checkpoint

ROOT = Path(__file__).resolve().parents[3]
SEMANTIC = ["-o", "language_numerics=semantic"]


# ------------------------------------------------------------------ the slices, in one process

@pytest.fixture(scope="module")
def whole():
    return LanguageModel.load(tiny_language_checkpoint(), dtype=torch.float32, backend=backends.get("torch"))


def rank_models(world):
    ckpt = tiny_language_checkpoint()
    return [LanguageModel.load(ckpt, dtype=torch.float32, backend=backends.get("torch"), parallel=Parallel(r, world))
            for r in range(world)]


@pytest.mark.parametrize("world", [1, 2, 4])  # 4 ranks > 2 output groups: a group split over two ranks
def test_attention_partials_sum_to_the_unsharded_output(whole, world):
    x = torch.randn(7, whole.cfg.dim, generator=torch.Generator().manual_seed(1))
    layer = 2  # a compressed, index-source layer: its compressor and indexer are replicated
    want = whole.attn[layer](x, 0, whole.attn[layer].new_cache(torch.float32, "cpu"), ChunkShared())
    got = sum(Attention.__call__(m.attn[layer], x, 0, m.attn[layer].new_cache(torch.float32, "cpu"), ChunkShared())
              for m in rank_models(world))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("world", [2, 4])
def test_experts_and_shared_slices_sum_to_the_unsharded_moe(whole, world):
    x = torch.randn(9, whole.cfg.dim, generator=torch.Generator().manual_seed(2))
    y, w, ids = whole.moe[0](x)
    models = rank_models(world)
    got = sum(MoE.__call__(m.moe[0], x)[0] for m in models)
    torch.testing.assert_close(got, y, atol=1e-5, rtol=1e-5)
    held = [(m.moe[0].experts.first, m.moe[0].experts.n) for m in models]
    assert held == [(r * 8 // world, 8 // world) for r in range(world)]  # each rank's own experts only


def test_a_rank_reads_only_its_own_experts():
    par, cfg = Parallel(1, 4), LanguageModel.load(tiny_language_checkpoint(), dtype=torch.float32,
                                                  backend=backends.get("torch")).cfg
    assert par.reads("layers.0.ffn.experts.2.w1.weight", cfg) and par.reads("layers.0.ffn.experts.3.w2.weight", cfg)
    assert not par.reads("layers.0.ffn.experts.4.w1.weight", cfg) and par.reads("layers.0.ffn.gate.bias", cfg)


def test_a_model_that_does_not_split_is_refused():
    from engine.errors import EngineInputError

    with pytest.raises(EngineInputError, match=r"\(8\) does not split over 3 ranks"):
        rank_models(3)


# ------------------------------------------------------------------ torchrun

@pytest.fixture(scope="module")
def picture(module_tmp):
    from PIL import Image

    p = module_tmp("img") / "small.png"
    g = torch.Generator().manual_seed(3)
    Image.fromarray((torch.rand(96, 130, 3, generator=g) * 255).byte().numpy()).save(p)
    return p


def env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def oracle_dump(out: Path, picture, numerics) -> Path:
    # in this process: what is tested here is the sharded runs, not the `dump` command's process
    from tensordiff.commands.cli import main

    with pytest.raises(SystemExit) as e:
        main(["dump", "deepseek-v4.1-flash", "--side", "oracle", "--image", str(picture), "--prompt",
              "Describe <image>.", "--decode", "2", "--out", str(out), *numerics])
    assert e.value.code == 0
    return out


@pytest.fixture(scope="module")
def oracle(module_tmp, picture):
    return oracle_dump(module_tmp("oracle") / "o", picture, SEMANTIC)


@pytest.fixture(scope="module")
def official_oracle(module_tmp, picture):
    """The oracle in the official numerics, dumped once for every test that compares against it."""
    return oracle_dump(module_tmp("official") / "o", picture, [])


# Every sharded run the tests below judge, (world, fault, official numerics), in one torchrun
# launch of the largest world (rank_scenarios.py; a run of 2 ranks takes ranks 0 and 1 of it, with
# the RANK and WORLD_SIZE a launch of 2 would give them): a launch is a Python + torch start-up a
# rank and one for the agent, several times what the tiny runs themselves cost. Each run is still
# the rank program's own `-m` entry with its own arguments, output directory and exit status.
RUNS = {2: [(None, False), ("shard-order-reversed", False), ("partial-as-replicated", False),
            ("expert-bias-shift", False), ("shard-order-reversed", True), ("expert-bias-shift", True)],
        4: [(None, False), ("expert-bias-shift", False)]}


def _run_dir(root: Path, world: int, fault, official: bool) -> Path:
    return root / f"w{world}-{fault or 'clean'}-{'official' if official else 'semantic'}" / "run"


def torchrun(root: Path, picture, runs: dict) -> subprocess.CompletedProcess:
    """One launch running the rank program once per (world, fault, official) of `runs`."""
    plan = []
    for world, cases in runs.items():
        for fault, official in cases:
            args = ["--image", str(picture), "--prompt", "Describe <image>.", "--decode", "2",
                    "--out", str(_run_dir(root, world, fault, official)), *([] if official else SEMANTIC)]
            plan.append({"world": world, "argv": args + (["--fault", fault] if fault else [])})
    (root / "plan.json").write_text(json.dumps(plan))
    scratch = root / "tmp"  # torchrun's agent leaves a torchelastic_* directory in TMPDIR
    scratch.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           str(max(runs)), str(Path(__file__).with_name("rank_scenarios.py")), str(root / "plan.json")],
                          capture_output=True, text=True, cwd=ROOT, env={**env(), "TMPDIR": str(scratch)}, timeout=300)


@pytest.fixture(scope="module")
def launches(module_tmp, picture):
    root = module_tmp("runs")
    return root, torchrun(root, picture, RUNS)


def sharded_run(launches, world: int, fault=None, official: bool = False) -> Path:
    """The run's directory, once every rank of it exited 0 (else its ranks' output fails the test)."""
    root, proc = launches
    run = _run_dir(root, world, fault, official)
    rcs = [Path(f"{run}.rc.rank{r}") for r in range(world)]
    logs = "".join(Path(f"{run}.log.rank{r}").read_text() for r in range(world) if Path(f"{run}.log.rank{r}").exists())
    assert all(p.exists() and p.read_text() == "0" for p in rcs), \
        logs + proc.stderr[-3000:]
    return run


@pytest.mark.parametrize("world", [2, 4])
def test_torchrun_rank_dumps_merge_and_match_the_unsharded_oracle(launches, oracle, world):
    run = sharded_run(launches, world)
    ranks = sorted(x.name for x in run.iterdir())
    assert ranks == [f"rank{r}" for r in range(world)]
    m = json.loads((run / "rank1" / "manifest.json").read_text())
    lay = {t["name"]: t for t in m["tensors"]}
    assert m["run"]["parallel"]["world"] == world and lay["attn.0"]["partial"] == "sum"
    assert lay["logits"]["shard"] == {"axis": 1, "index": 1, "count": world}
    assert lay["logits.step.1"]["shard"]["count"] == world and lay["router.0.scores"]["replicated"] is True
    assert lay["hidden.0"]["replicated"] is True and lay["aligner"]["replicated"] is True
    assert lay["logits"]["shape"][1] == 512 // world  # the rank's vocab slice
    rep = compare_dumps(oracle, run)
    assert rep.verdict == "match", str(rep)
    assert any("sharded run of" in n for n in rep.notes)
    assert len(rep.boundaries) >= 30


@pytest.mark.parametrize("fault, world, disagree, words", [
    ("shard-order-reversed", 2, [0, 1], "shards in the wrong order"),
    ("partial-as-replicated", 2, [0, 1], "replicas differ between ranks"),
    ("expert-bias-shift", 2, [1], "against the other side rank 1 diverges"),
    ("expert-bias-shift", 4, [3], "rank 3 disagrees with the majority, ranks 0, 1, 2"),
])
def test_each_sharded_fault_is_named_at_its_boundary_with_its_rank(launches, oracle, fault, world, disagree, words):
    rep = compare_dumps(oracle, sharded_run(launches, world, fault))
    boundary = FAULTS[fault][0]
    assert rep.verdict == "diverged" and rep.earliest == [boundary], str(rep)
    bad = [t for t in rep.boundary(boundary).tensors if t.status == "diverged"]
    assert bad and bad[0].ranks["disagree"] == disagree and words in bad[0].reason, bad[0].reason


@pytest.mark.parametrize("fault, disagree", [("shard-order-reversed", [0, 1]), ("expert-bias-shift", [1])])
def test_in_the_official_numerics_a_rank_finding_is_no_near_tie_cascade(launches, official_oracle, fault, disagree):
    # bf16 + the kernels' rounding: the sharded reductions flip some router choices on near-ties
    # (benign), and everything after them is judged as that flip's cascade; a misplaced shard or
    # replicas that differ are still named, and the rank judged with the tie rule
    rep = compare_dumps(official_oracle, sharded_run(launches, 2, fault, official=True))
    boundary = FAULTS[fault][0]
    assert rep.verdict == "diverged" and rep.earliest == [boundary], str(rep)
    bad = [t for t in rep.boundary(boundary).tensors if t.status == "diverged"]
    assert bad[0].ranks["disagree"] == disagree, bad[0].reason


def rank_main(argv, monkeypatch, capsys, **env) -> tuple[int, str]:
    """The rank program's `main` in this process, with the RANK / WORLD_SIZE a launcher would give
    it: every refusal below happens before the process group starts, so the process itself is not
    what is tested (the torchrun launch above runs the `-m` entry and its exit status)."""
    from engine.deepseek_v41_flash.distributed import main

    monkeypatch.delenv("MASTER_ADDR", raising=False)  # a refusal that came too late fails, never waits on a peer
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code = main(argv)
    return code, capsys.readouterr().err


def test_bad_input_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    code, err = rank_main(["--out", str(tmp_path / "x"), "--fault", "no-such-fault"], monkeypatch, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "shard-order-reversed" in err and not (tmp_path / "x").exists()


def test_an_existing_run_is_never_overwritten(tmp_path, monkeypatch, capsys):
    (tmp_path / "run" / "rank1").mkdir(parents=True)
    e = {"RANK": "0", "WORLD_SIZE": "2"}  # rank 0 of 2 refuses before it waits on rank 1
    code, err = rank_main(["--out", str(tmp_path / "run")], monkeypatch, capsys, **e)
    assert code == 2 and "already holds rank1" in err and not (tmp_path / "run" / "rank0").exists()
    (tmp_path / "run" / "rank7").mkdir()
    code, err = rank_main(["--out", str(tmp_path / "run"), "--force"], monkeypatch, capsys, **e)
    assert code == 2 and "rank7, which is no rank of a 2-rank run" in err, err
