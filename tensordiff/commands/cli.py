"""The `tensordiff` command line.

Exit status everywhere: 0 all within tolerance, 1 a material divergence, 2 bad input or usage
(one line on stderr, no traceback).
"""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from tensordiff.commands.openmp import passive_waits
from tensordiff.commands.calibrate import DEFAULT_VARIANTS, calibrate as run_calibrate
from tensordiff.pipeline.calibration import rule_of, write as write_calibration
from tensordiff.commands.gate import load_gate, render_breakdown, run_gate
from tensordiff.commands import heap
from tensordiff.format import importers
from tensordiff.format.dump import open_dump
from tensordiff.format.importers import hf_debugger, polygraphy, sglang
from tensordiff.format.plain import open_any
from tensordiff.judge import replay_check
from tensordiff.judge.contract_file import load as load_contract
from tensordiff.judge.rank_check import parts_verified
from tensordiff.pipeline import registry
from tensordiff.pipeline.case import (
    CaseSpec, check as run_check, check_weights, lone_case, parse_passes, write_reports,
)
from tensordiff.pipeline.compare import compare_dumps, three_way
from tensordiff.pipeline.options import render
from tensordiff.pipeline.runs import make_request, run_dtype, run_side
from tensordiff.reports.text import print_rich, render_text
from tensordiff.reports.text import dump_header, dump_table, shape_text

passive_waits()  # before anything imports torch: idle OpenMP workers sleep, not spin (see openmp.py)

import click  # noqa: E402

from tensordiff.version import VERSION  # noqa: E402
from tensordiff.errors import BadInput  # noqa: E402
from tensordiff.reports.outputs import gate_inputs, guard, guard_reports  # noqa: E402

EXIT = ("Exit status: 0 every boundary within tolerance, 1 a material divergence, 2 bad input or usage "
        "(one line on stderr).")


def _epilog(examples: str, exit_status: str = EXIT) -> str:
    """A command's help ends with its examples (each runs as written from the repository root;
    the comment says the exit status it gives) and its exit statuses."""
    wrapped = "\n".join(textwrap.wrap(exit_status, 96))
    return f"\b\nExamples (from the repository root):\n{examples.rstrip()}\n\n\b\n{wrapped}\n"


EPILOG_COMPARE = _epilog("""\
  tensordiff compare dumps/sample-oracle dumps/sample-engine                      # exit 1: `rope`, interleaved
  tensordiff compare dumps/sample-oracle dumps/sample-engine --verify --fail-fast  # exit 1
  tensordiff compare dumps/sample-oracle/patches.safetensors dumps/sample-engine/patches.safetensors  # exit 0
  tensordiff compare dumps/sample-oracle dumps/sample-engine --json report.json --html report.html  # exit 1
With --floor DIR (the oracle's dump in B's precision) B's error is judged as a multiple of the
floor's: README.md, "Judging in one screen".""")


def _console():
    from rich.console import Console

    return Console(stderr=False, highlight=False)


def _progress_factory(total: int, label: str):
    """A byte progress bar on a terminal for large work; nothing when piped or small."""
    if total < (256 << 20) or not sys.stderr.isatty():
        return None, None
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    prog = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                    TransferSpeedColumn(), transient=True)
    task = prog.add_task(label, total=total)
    return prog, (lambda n: prog.advance(task, n))


def _weights_path(spec):
    return spec if spec and not str(spec).startswith("synthetic:") else None


ALL_OPTION = click.option("--all", "show_all", is_flag=True, help="Show every row of the table (default: the first 200).")


def _print_report(report, show_all: bool = False) -> int:
    if sys.stdout.isatty():
        print_rich(report, _console())
    else:
        click.echo(render_text(report, None if show_all else 200))
    return 0 if report.verdict == "match" else 1


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(VERSION, prog_name="tensordiff")
def cli():
    """Run an inference engine beside the official PyTorch oracle, compare tensors at named
    boundaries, and name the EARLIEST material divergence.

    \b
    Start here (from the repository root):
      tensordiff check deepseek-v4.1-flash                         # exit 0: all 6 boundaries match
      tensordiff check deepseek-v4.1-flash --fault aligner-flat-pad  # exit 1: names `aligner`
      tensordiff faults                                            # exit 0: the planted bugs
      tensordiff compare dumps/sample-oracle dumps/sample-engine   # exit 1: names `rope`

    \b
    Exit status everywhere: 0 every boundary within tolerance, 1 a material divergence, 2 bad
    input or usage (one line on stderr, no traceback). `tensordiff COMMAND --help` for each.
    """


@cli.command(epilog=EPILOG_COMPARE)
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Also write the machine report here.")
@click.option("--tolerances", type=click.Path(path_type=Path),
              help="TOML tolerance file (default: [tool.tensordiff] of the nearest pyproject.toml).")
@click.option("--fail-fast", is_flag=True, help="Stop at the first diverged boundary (in DAG order).")
@click.option("--verify", is_flag=True, help="Check every tensor's sha256 while streaming it.")
@click.option("--junit", "junit_path", type=click.Path(path_type=Path), help="Also write a JUnit XML report here.")
@click.option("--html", "html_path", type=click.Path(path_type=Path),
              help="Also write a self-contained HTML report (boundary table, error heatmaps) here.")
@click.option("--floor", "floor_dir", type=click.Path(path_type=Path),
              help="The oracle's dump in B's low precision (the floor run): judge B's error against A "
                   "as a multiple of the floor's (three-way, row-aware).")
@click.option("--contract", "contract_path", type=click.Path(path_type=Path),
              help="A contract file (TOML) naming the boundaries of A's and B's tensors, their DAG, layout, "
                   "modes and tolerances (README.md, \"Contract files\").")
@ALL_OPTION
def compare(a, b, json_path, tolerances, fail_fast, verify, junit_path=None, html_path=None, floor_dir=None,
            show_all=False, contract_path=None):
    """Compare dump A (reference, e.g. the oracle) with dump B (candidate, e.g. your engine).
    A and B are dumps, or plain .safetensors files (or folders of them) with no manifest."""
    guard_reports(json_path, junit_path, html_path, inputs=[a, b, tolerances, floor_dir, contract_path])
    da, db = open_any(a), open_any(b)
    contract, contract_notes = None, []
    if contract_path is not None and floor_dir is not None:
        raise BadInput("--contract and --floor cannot be combined (the three-way pass reads the model's own contract)")
    if contract_path is not None:
        da, db, contract, contract_notes = load_contract(contract_path).bind(da, db)
    if verify:
        contract_notes += _unverified(da, db)
    if floor_dir is not None:
        report = three_way(da, open_dump(floor_dir), db, rule_of(tolerances), tolerances=tolerances)
    else:
        report = None
    prog, cb = _progress_factory(da.nbytes + db.nbytes, "comparing") if report is None else (None, None)
    if prog:
        with prog:
            report = compare_dumps(da, db, tolerances, contract=contract, fail_fast=fail_fast, verify=verify,
                                   progress=cb)
    elif report is None:
        report = compare_dumps(da, db, tolerances, contract=contract, fail_fast=fail_fast, verify=verify)
    report.notes[:0] = contract_notes
    compared = [t for bd in report.boundaries for t in bd.tensors]
    if compared and all(t.status == "skipped" for t in compared):
        raise BadInput(f"nothing compared: every tensor that {a} and {b} both hold is empty")
    if json_path or junit_path or html_path:  # the report writers (and their imports) only when asked for

        write_reports(report_json=report.as_json(), json_path=json_path,
                      cases=[lone_case(report, da if html_path else None)], junit_path=junit_path,
                      html_path=html_path, title=f"tensordiff: {report.model}")
    sys.exit(_print_report(report, show_all))


EPILOG_INSPECT = _epilog("""\
  tensordiff inspect dumps/sample-engine             # exit 0
  tensordiff inspect dumps/sample-engine --verify    # exit 0: every tensor's sha256 checked""",
                         "Exit status: 0 listed (and verified), 2 bad input: a dump or checkpoint that cannot be read "
                         "(a checkpoint's whole report is printed first), a sha256 that does not match (one line on "
                         "stderr).")


def _is_checkpoint(directory: Path) -> bool:
    """A model checkpoint directory (config.json and safetensors weights, no dump manifest)."""
    return (directory.is_dir() and not (directory / "manifest.json").exists() and (directory / "config.json").is_file()
            and ((directory / "model.safetensors.index.json").is_file() or (directory / "model.safetensors").is_file()))


def _inspect_checkpoint(directory: Path, layers: str | None) -> None:
    for name in registry.names():
        adapter = registry.adapter(name)
        view = adapter.checkpoint()(directory, layers) if adapter.checkpoint is not None else None
        if view is not None:
            for line in view.lines():
                click.echo(line)
            if view.problems:
                more = f" (and {len(view.problems) - 1} more, listed above)" if len(view.problems) > 1 else ""
                raise BadInput(f"{directory} cannot be read by that run: {view.problems[0]}{more}")
            return
    raise BadInput(f"{directory} is a checkpoint directory, but no installed model adapter describes its config.json")


def _unverified(da, db) -> list[str]:
    """`--verify`'s notes on the tensors it cannot check (no sha256 recorded); exit 2 when no
    tensor of either dump has one: nothing would be verified."""
    notes = []
    def digested(e) -> bool:  # a merged (sharded) tensor is verified through its ranks' parts
        return e.sha256 is not None or any(p.sha256 for p in getattr(e.stored, "parts", ()))

    bare = {side: [e.name for e in d.entries if not digested(e)] for side, d in (("A", da), ("B", db))}
    if all(len(bare[s]) == len(d.entries) for s, d in (("A", da), ("B", db))):
        raise BadInput(f"--verify: no tensor of {da.path} or {db.path} records a sha256; nothing would be "
                       "verified (drop --verify, or record the dumps with tensordiff's Recorder)")
    for side, names in bare.items():
        if names:
            notes.append(f"--verify: {len(names)} tensor(s) of side {side} record no sha256 and were not verified: "
                         f"{', '.join(names[:5])}{', ...' if len(names) > 5 else ''}")
    return notes


@cli.command(epilog=EPILOG_INSPECT)
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--verify", is_flag=True, help="Read every tensor and check its sha256 (a dump).")
@click.option("--layers", default=None, metavar="IDS",
              help="A checkpoint: the DeepSeek language layers a run would read (e.g. 0-2 or 0,2; default all).")
def inspect(directory, verify, layers):
    """List a dump's model, producer, run and tensors (reads no tensor data unless --verify);
    a plain .safetensors file or folder is listed too. On a model checkpoint directory: the
    model, the units and layers present, how each tensor group is stored, what a run converts on
    load, what is missing, and the bytes a run with --layers reads (headers only)."""
    if _is_checkpoint(directory):
        if verify:
            raise BadInput("--verify checks a dump's sha256s; a checkpoint has none (inspect it without --verify)")
        return _inspect_checkpoint(directory, layers)
    if layers is not None:
        raise BadInput(f"--layers describes a checkpoint directory; {directory} is not one")
    d = open_any(directory)
    click.echo("\n".join(dump_header(d)))
    if d.world:  # rank dumps merged: the shapes below are the logical (whole) ones
        click.echo(f"  sharded run of {d.world} ranks; shapes are the merged tensors'")
    rows = []
    bad = 0
    for e in d.entries:
        status = ""
        if verify and d.world and hasattr(e.stored, "parts"):  # a merged tensor: each rank's part

            ok, any_sha = parts_verified(e)
            status = "  sha256 ok (each rank)" if ok and any_sha else ("  no sha256" if ok else "  SHA256 MISMATCH")
            bad += not ok
        elif verify:
            ok = e.sha256 is None or e.computed_sha256() == e.sha256
            status = "  sha256 ok" if ok and e.sha256 else ("  no sha256" if ok else "  SHA256 MISMATCH")
            bad += not ok
        rows.append((e.name, e.boundary, e.dtype.name, shape_text(e.shape), f"{e.stored.nbytes / 1e6:.3f}",
                     f"{e.stored.file.name}:{e.stored.key}{status}"))
    click.echo("\n".join(dump_table(rows)))
    click.echo(f"{len(d.entries)} tensors, {d.nbytes / 1e6:.1f} MB")
    frozen = replay_check.note(d, read=verify)  # without --verify, from the manifest's digests only
    if frozen:
        click.echo(f"note: {frozen}")
    if verify and d.entries and all(e.sha256 is None and not any(p.sha256 for p in getattr(e.stored, "parts", ()))
                                    for e in d.entries):
        raise BadInput(f"--verify: no tensor of {d.path} records a sha256; nothing was verified")
    if bad:
        raise BadInput(f"{bad} tensor(s) in {d.path} fail their sha256: the files are corrupt")


def _split_images(ctx, _param, value):
    """A repeated --image: the first stays `image` (what every single-image path reads), the
    rest go to `more_images`, in order."""
    ctx.params["more_images"] = tuple(value[1:])
    return value[0] if value else None


def _model_options(f):
    opts = [
        click.option("--image", type=click.Path(path_type=Path), multiple=True, callback=_split_images,
                     help="Input image (default: the embedded 1024x701 test picture); repeat it for several "
                          "images, one per `<image>` of --prompt, in order (DeepSeek V4.1 Flash)."),
        click.option("--weights", default="synthetic:tiny", show_default=True,
                     help="synthetic:tiny | synthetic:full | synthetic:<variant> | a checkpoint directory."),
        click.option("--device", default="cpu", show_default=True, help="cpu or cuda[:N]."),
        click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default=None,
                     help="The run's dtype (default: the model's official one, what its checkpoint declares: "
                          "DeepSeek V4.1 Flash bfloat16 end to end, Qwen3-VL its config's dtype). float32 is the "
                          "semantic route: exact numerics on both halves."),
        click.option("--backend", type=click.Choice(["torch", "hip"]), default="torch", show_default=True,
                     help="Engine kernels: torch reference ops or compiled HIP kernels (needs a GPU)."),
        click.option("--fault", default=None, help="Plant a named engine fault (see `tensordiff faults`)."),
        click.option("--prompt", default=None, help="Text around the image; `<image>` marks where it goes."),
        click.option("--chunk", type=click.IntRange(min=1), default=None, help="Engine prefill chunk length."),
        click.option("--decode", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Decode steps after the prompt."),
        click.option("--layers", default=None, metavar="IDS",
                     help="DeepSeek language backbone: run only these layers (e.g. 0-2 or 0,2), real dimensions."),
        click.option("--processor", type=click.Choice(["pil", "torchvision"]), default=None,
                     help="Qwen3-VL image processor for both sides (default: pil; torchvision needs a torchvision "
                          "built for your torch)."),
        click.option("--option", "-o", "extra", multiple=True, metavar="NAME=VALUE",
                     help="A model's run option, repeatable (e.g. -o attention=math, -o kernel_quant=false); "
                          "each model's are listed below and by `tensordiff options MODEL`."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


class _ModelCommand(click.Command):
    """A command taking MODEL: its --help ends with every installed model's option table."""

    def format_epilog(self, ctx, formatter):
        with formatter.section("Model options (-o NAME=VALUE; also `tensordiff options MODEL`)"):
            for name in registry.names():
                try:
                    text = render(registry.adapter(name))
                except BadInput as e:  # an adapter that cannot load: say so, keep the help
                    text = f"{name}: {e}"
                formatter.write_text("\b\n" + text)
        super().format_epilog(ctx, formatter)  # the examples and exit statuses last


EPILOG_DUMP = _epilog("""\
  tensordiff dump deepseek-v4.1-flash --side oracle --out out/oracle --force       # exit 0
  tensordiff dump deepseek-v4.1-flash --side engine --out out/engine --force \\
      --fault rope-interleaved                                                    # exit 0
  tensordiff compare out/oracle out/engine                                         # exit 1: `rope`
  tensordiff dump qwen3-vl --side engine --image gates/images/qwen-odd-150x230.png --out out/qwen --force  # exit 0""",
                      "Exit status: 0 the dump was written, 2 bad input or usage (one line on stderr); an existing "
                      "--out is replaced only with --force, and only when it is a tensordiff dump.")


@cli.command(cls=_ModelCommand, epilog=EPILOG_DUMP)
@click.argument("model")
@click.option("--side", type=click.Choice(["oracle", "engine"]), required=True)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Dump directory to create.")
@click.option("--format", "fmt", type=click.Choice(["safetensors", "hdf5"]), default="safetensors", show_default=True)
@click.option("--force", is_flag=True, help="Replace an existing tensordiff dump at --out: its manifest and the files "
              "it names; a directory holding any other file is refused.")
@_model_options
def dump(model, side, out, fmt, force, **kw):
    """Run one side of MODEL on an image and write its boundary tensors to a dump directory."""
    adapter, req = make_request(model, **kw)
    if side == "oracle" and req.fault:
        raise BadInput("--fault plants an engine bug; the oracle has none")
    path = run_side(adapter, side, req, out, fmt=fmt, overwrite=force)
    click.echo(f"wrote {path}")


EPILOG_CHECK = _epilog("""\
  tensordiff check deepseek-v4.1-flash                                   # exit 0: all 6 boundaries match
  tensordiff check deepseek-v4.1-flash --fault aligner-flat-pad          # exit 1: names `aligner`
  tensordiff check deepseek-v4.1-flash --image gates/images/deepseek-small-300x200.png \\
      --prompt "Describe <image>." --chunk 16 --decode 2                 # exit 0: the language half too
  tensordiff check qwen3-vl --image gates/images/qwen-odd-150x230.png --json report.json --html report.html  # exit 0""",
                       "Exit status: 0 every boundary within tolerance (in every pass), 1 a material divergence "
                       "(end to end, or the local error of a stage), 2 bad input or usage (one line on stderr).")


@cli.command(cls=_ModelCommand, epilog=EPILOG_CHECK)
@click.argument("model")
@_model_options
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Also write the machine report here.")
@click.option("--tolerances", type=click.Path(path_type=Path), help="TOML tolerance file.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Keep both dumps under this directory (oracle/ and engine/).")
@click.option("--oracle-dtype", type=click.Choice(["float32", "bfloat16"]), default=None,
              help="The reference's dtype: float32 in every pass (a bf16 oracle is the numeric pass's floor "
                   "run, never a reference).")
@click.option("--no-cache", is_flag=True, help="Run the oracle even when a cached dump for these inputs exists.")
@click.option("--passes", default="auto", show_default=True, metavar="auto|PASS[,PASS]",
              help="Which passes run. auto: the gate's case, semantic,numeric for a low-precision run (the "
                   "default: the model's official dtype), semantic alone with --dtype float32. One pass: "
                   "--passes semantic (float32 engine against the float32 oracle, exact numerics) or --passes "
                   "numeric (the run in its own precision, three-way against the float32 oracle's and the "
                   "oracle's own low-precision floor); direct is the float32 run alone, with its own options.")
@click.option("--local-error/--no-local-error", "local", default=None,
              help="Local error (each engine stage on the reference's tensors) in every pass; default: in each "
                   "pass that diverges (or holds a near-tie flip's cascade).")
@click.option("--junit", "junit_path", type=click.Path(path_type=Path), help="Also write a JUnit XML report here.")
@click.option("--html", "html_path", type=click.Path(path_type=Path),
              help="Also write a self-contained HTML report (boundary table, error heatmaps) here.")
@ALL_OPTION
def check(model, json_path, tolerances, out, oracle_dtype, no_cache, passes="auto", junit_path=None, html_path=None,
          show_all=False, local=None, **kw):
    """Run the oracle and the engine on one image, compare, and name the earliest divergence:
    one gate case (with no --dtype, the model's official dtype: the semantic pass, then the
    numeric pass judged against the oracle's own floor)."""
    guard_reports(json_path, junit_path, html_path,
                  inputs=[kw.get("image"), *kw.get("more_images", ()), _weights_path(kw.get("weights")), tolerances,
                          out])
    kw["dtype"] = run_dtype(registry.adapter(model), kw.get("weights") or "synthetic:tiny", kw.get("dtype"))
    chosen = parse_passes(passes, kw["dtype"], oracle_dtype)
    heap.freeze_torch()  # torch's objects out of the collector's way (a command's own process only: heap.py)
    case = run_check(CaseSpec(model, oracle_dtype=oracle_dtype, passes=chosen, **kw), out=out, tolerances=tolerances,
                     use_cache=not no_cache, views=html_path is not None, local=local)
    both = case.numeric is not None
    if json_path or junit_path or html_path:  # the report files (and their writers' imports) only when asked for
        report_json = case.as_json()  # the case schema the gate writes per case
        cases = [case] if both else [lone_case(case.report, views=case.views)]
        write_reports(report_json=report_json, json_path=json_path, cases=cases,
                      junit_path=junit_path, html_path=html_path, title=f"tensordiff: {case.report.model}")
    if both:
        click.echo(f"== {case.passes[0]} pass")
    code = _print_report(case.report, show_all)
    if both:
        click.echo("== numeric pass")
        code = max(code, _print_report(case.numeric, show_all))
    if case.local is not None:
        click.echo(f"local error: {case.local.summary()}")
        if case.local.origin is not None:
            code = 1
    if case.local_numeric is not None:
        click.echo(f"local error (numeric pass): {case.local_numeric.summary()}")
        if case.local_numeric.origin is not None:
            code = 1
    if both:
        click.echo(_pass_verdicts(case))
    sys.exit(code)


def _pass_verdicts(case) -> str:
    """The line that says which pass decided: each pass's verdict and the local error's."""
    parts = []
    for p, r in ((case.passes[0], case.report), ("numeric", case.numeric)):
        g = r.generated
        flip = (f", tokens differ from step {g['first']}{' (benign near-tie)' if g['benign'] else ''}"
                if g and g["first"] is not None else "")
        parts.append(f"{p}: {r.verdict}{flip}")
    for what, lr in (("local error", case.local), ("numeric local error", case.local_numeric)):
        if lr is not None:
            parts.append(f"{what}: {'origin ' + lr.origin if lr.origin else 'clean'}")
    return f"{'PASS' if case.passed else 'FAIL'} ({'; '.join(parts)})"


@cli.command(epilog=_epilog("""\
  tensordiff faults                        # exit 0: every installed model's faults
  tensordiff faults qwen3-vl               # exit 0""", "Exit status: 0 listed, 2 an unknown model (one line on stderr)."))
@click.argument("model", required=False)
def faults(model):
    """List the named faults the engine can carry and the boundary each must trip."""
    names = [model] if model else registry.names()
    if not names:
        raise BadInput("no model adapters are installed")
    for n in names:
        a = registry.adapter(n)
        click.echo(f"{a.name}:")
        for f in a.faults:
            click.echo(f"  {f.name:<32} -> {f.boundary:<16} {f.description}")
            if f.needs_text:
                click.echo(f"  {'':<32}    {'':<16} needs: {f.needs_text}")


@cli.command(epilog=_epilog("""\
  tensordiff options                       # exit 0: every installed model's options
  tensordiff options deepseek-v4.1-flash   # exit 0""", "Exit status: 0 listed, 2 an unknown model (one line on stderr)."))
@click.argument("model", required=False)
def options(model):
    """List each model's run options (-o NAME=VALUE): name, type, default, which side reads it, help."""
    names = [model] if model else registry.names()
    if not names:
        raise BadInput("no model adapters are installed")
    click.echo("\n\n".join(render(registry.adapter(n)) for n in names))


EPILOG_GATE = _epilog("""\
  tensordiff gate gates/deepseek-v4.1-flash.toml --junit gate.xml --html gate.html   # exit 0
  tensordiff gate gates/qwen3-vl.toml --fault rope-hw-swap -q                         # exit 1
The gate file's keys: gates/README.md.""",
                      "Exit status: 0 every case within tolerance, 1 a material divergence (end to end or local), "
                      "2 bad input (config, images, weights, tolerances; one line on stderr).")


@cli.command(epilog=EPILOG_GATE)
@click.argument("config", type=click.Path(path_type=Path))
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write the machine report (all cases, timings).")
@click.option("--junit", "junit_path", type=click.Path(path_type=Path),
              help="Write JUnit XML: one test case per model x image x boundary.")
@click.option("--html", "html_path", type=click.Path(path_type=Path),
              help="Write one self-contained HTML page with error heatmaps over the input pictures.")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Keep every case's dumps here.")
@click.option("--model", "models", multiple=True, help="Run only this model's cases (repeatable).")
@click.option("--fault", default=None, help="Plant a named engine fault in every model that has it.")
@click.option("--weights", default=None, help="Override every model's weights SPEC.")
@click.option("--device", default=None, help="Override every model's device (cpu, cuda[:N]).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default=None, help="Override the engine dtype.")
@click.option("--oracle-dtype", type=click.Choice(["float32", "bfloat16"]), default=None,
              help="Override the oracle dtype (default: the file's, else the engine's).")
@click.option("--backend", type=click.Choice(["torch", "hip"]), default=None, help="Override the engine kernels.")
@click.option("--layers", default=None, metavar="IDS", help="Override every model's DeepSeek language layer subset.")
@click.option("--no-cache", is_flag=True, help="Run the oracle even when a cached dump exists.")
@click.option("--no-local-error", is_flag=True, help="Skip the per-stage local error runs.")
@click.option("-q", "--quiet", is_flag=True, help="Only the summary line per case and the verdict.")
def gate(config, json_path, junit_path, html_path, out, models, fault, weights, device, dtype, oracle_dtype, backend,
         layers, no_cache, no_local_error, quiet):
    """Run a CI gate: every model x image x prompt of CONFIG, oracle beside engine, compared at every
    boundary and stage; fails with the earliest divergence."""
    import time


    cfg = load_gate(config)
    guard_reports(json_path, junit_path, html_path, inputs=[config, out, *gate_inputs(cfg)])
    weights = check_weights(weights, Path.cwd(), "--weights") if weights is not None else None
    overrides = {"weights": weights, "device": device, "dtype": dtype, "oracle_dtype": oracle_dtype, "backend": backend,
                 "layers": layers}
    heap.freeze_torch()  # torch's objects out of the collector's way (a command's own process only: heap.py)
    res = run_gate(cfg, fault=fault, models=list(models) or None, out=out, use_cache=False if no_cache else None,
                   local=False if no_local_error else None, overrides=overrides, html=html_path is not None,
                   echo=click.echo)
    t0 = time.perf_counter()
    write_reports(cases=res.cases, junit_path=junit_path, html_path=html_path, title=cfg.name, name=cfg.name)
    res.timings["report"] = time.perf_counter() - t0
    res.timings["total"] = res.timings.get("total", 0.0) + res.timings["report"]
    write_reports(report_json=res.as_json() if json_path else None, json_path=json_path)
    if not quiet:
        for c in res.cases:
            if not c.passed and c.report is not None:
                click.echo("")
                click.echo(f"== {c.label}" + (f" ({c.passes[0]} pass)" if c.numeric is not None else ""))
                click.echo(render_text(c.report))
                if c.numeric is not None:
                    click.echo(f"== {c.label} (numeric pass)")
                    click.echo(render_text(c.numeric))
                if c.local is not None:
                    click.echo(f"local error: {c.local.summary()}")
        click.echo("")
        click.echo(render_breakdown(res))
    for line in res.coverage_lines():  # warnings (to stderr) even when quiet: a rule no image reaches
        if line.startswith("warning"):
            click.echo(line, err=True)
        elif not quiet:
            click.echo(line)
    failed = [c for c in res.cases if not c.passed]
    if failed:
        click.echo(f"GATE FAIL: {len(failed)} of {len(res.cases)} case(s) diverged ({cfg.name})")
    else:
        click.echo(f"GATE PASS: {len(res.cases)} case(s) within tolerance ({cfg.name})")
    sys.exit(res.exit_code)


EPILOG_CALIBRATE = _epilog("""\
  tensordiff calibrate gates/deepseek-v4.1-flash.toml --out calibration.toml   # exit 0
Then name the file in the gate (`tolerances = "calibration.toml"`, a path relative to the gate file):
gates/README.md, "Calibration: tolerances from the noise floor".""", "Exit status: 0 the file was written, 2 bad input or usage (one line on stderr).")


@cli.command(epilog=EPILOG_CALIBRATE)
@click.argument("config", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Tolerance file to write; with several models put {model} in the name.")
@click.option("--model", "models", multiple=True, help="Calibrate only this model (repeatable).")
@click.option("--variant", "variants", multiple=True,
              help="KEY=VALUE the oracle changes against itself: dtype=bfloat16 (default), sdpa=math|flash|"
                   "efficient|cudnn, or an oracle run option (`tensordiff options MODEL`) such as "
                   "attention=eager. Repeatable.")
@click.option("--multiple", type=float, default=10.0, show_default=True, help="Tolerance = this many times the floor.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True,
              help="The reference oracle's dtype.")
@click.option("--device", default=None, help="Override the gate's device.")
@click.option("--no-cache", is_flag=True, help="Run the oracle even when a cached dump exists.")
@click.option("--no-engine-profile", is_flag=True,
              help="Skip the clean engine's profile (its ratios to the floor, for the gate's numeric pass).")
@click.option("--repeats", type=int, default=1, show_default=True,
              help="Run the clean engine this many times per image: the profile's spread then covers "
                   "run-to-run variation (recorded as run_spread).")
def calibrate(config, out, models, variants, multiple, dtype, device, no_cache, no_engine_profile=False, repeats=1):
    """Measure each boundary's noise floor (the oracle against itself at another precision or
    attention kernel, on the gate's images) and write tolerances as a multiple of it."""
    cfg = load_gate(config)
    mcs = [m for m in cfg.models if not models or m.name in models]
    if not mcs:
        raise BadInput(f"no model of {config} matches --model {', '.join(models)}")
    if len(mcs) > 1 and "{model}" not in str(out):
        raise BadInput(f"{config} has {len(mcs)} models: put {{model}} in --out (e.g. tol-{{model}}.toml) or pick --model")
    for m in mcs:
        path = Path(str(out).replace("{model}", m.name))
        guard(path, "--out", "calibration", [config, *gate_inputs(cfg)])
        if any(isinstance(i, tuple) for i in m.images):
            raise BadInput(f"{config}: calibrate runs one image per case; {m.name} lists several images in one case")
        cal = run_calibrate(m.name, list(m.images), weights=m.weights, device=device or m.device, dtype=dtype,
                            variants=list(variants) or list(DEFAULT_VARIANTS), multiple=multiple,
                            use_cache=cfg.cache and not no_cache, echo=lambda s: click.echo(s, err=True),
                            engine_profile=not no_engine_profile, backend=m.backend, options=m.options,
                            repeats=repeats)
        write_calibration(cal, path)
        click.echo(cal.render_text())
        click.echo(f"wrote {path}")


EXIT_IMPORT = ("Exit status: 0 the dump was written, 2 bad input or usage (one line on stderr; a file that would "
               "need unpickling is refused, never loaded).")


@cli.group("import", epilog=_epilog("""\
  tensordiff import hf-debugger tests/data/import/hf-debugger --out out/hf-dump --force           # exit 0
  tensordiff import polygraphy tests/data/import/polygraphy/outputs.json --out out/poly --force  # exit 0
  python tests/data/import/make_sglang_sample.py                                                 # exit 0
  tensordiff import sglang tests/data/import/sglang/tp2/exp --out out/sglang-tp2 --force         # exit 0""",
                                      EXIT_IMPORT))
def import_():
    """Turn another tool's saved tensors into a tensordiff dump (no pickle is ever loaded)."""


def _import_options(f):
    for o in reversed([
        click.option("--out", type=click.Path(path_type=Path), required=True, help="Dump directory to create."),
        click.option("--model", default=None, help="The dump's model name (default: the tool's, else 'plain')."),
        click.option("--force", is_flag=True, help="Replace an existing tensordiff dump at --out: its manifest and "
                     "the files it names (any other file: refused)."),
    ]):
        f = o(f)
    return f


def _write_import(imp, out, model, force):
    path = importers.write(imp, out, model=model, overwrite=force)
    for note in imp.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"wrote {path}: {len(imp.tensors)} tensors from {imp.tool}")


@import_.command("hf-debugger", epilog=_epilog("""\
  tensordiff import hf-debugger tests/data/import/hf-debugger --out out/hf-dump --force   # exit 0
  tensordiff inspect out/hf-dump                                                          # exit 0""",
                                               EXIT_IMPORT))
@click.argument("directory", type=click.Path(path_type=Path))
@_import_options
def import_hf_debugger(directory, out, model, force):
    """Import transformers' model-addition debugger output (DIRECTORY: its debug_path, written
    with use_repr=False): every module's inputs and leaf outputs, in call order."""
    imp = hf_debugger.read(directory)
    _write_import(imp, out, model or imp.facts.get("model_class") or "plain", force)


@import_.command("polygraphy", epilog=_epilog("""\
  tensordiff import polygraphy tests/data/import/polygraphy/outputs.json --out out/poly --force  # exit 0
  tensordiff import polygraphy tests/data/import/polygraphy/two_runners.json --runner ort-b \\
      --iteration 1 --out out/poly-b --force                                                     # exit 0""",
                                              EXIT_IMPORT))
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--runner", default=None, help="Which runner's results (needed when the file holds several).")
@click.option("--iteration", type=click.IntRange(min=0), default=None,
              help="Which iteration (needed when the runner has several).")
@_import_options
def import_polygraphy(file, runner, iteration, out, model, force):
    """Import Polygraphy's saved outputs (--save-outputs, RunResults JSON) or saved inputs
    (--save-inputs); arrays are read with allow_pickle=False."""
    imp = polygraphy.read(file, runner=runner, iteration=iteration)
    _write_import(imp, out, model or "plain", force)


@import_.command("sglang", epilog=_epilog("""\
  python tests/data/import/make_sglang_sample.py   # exit 0: writes the sample (the dumper's files are pickles)
  tensordiff import sglang tests/data/import/sglang/tp1/exp --out out/sglang-tp1 --force   # exit 0
  tensordiff import sglang tests/data/import/sglang/tp2/exp --out out/sglang-tp2 --force   # exit 0: rank0, rank1
  tensordiff compare out/sglang-tp1 out/sglang-tp2                                          # exit 0: shards merged
  tensordiff import sglang tests/data/import/sglang/tp2/exp --rank 1 --step 0 --out out/sglang-r1 --force  # exit 0
A worked example, a planted bug named at its module: examples/sglang_dump/README.md.""", EXIT_IMPORT))
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--step", type=click.IntRange(min=0), default=None,
              help="Import this step only, under the plain names (default: every step; later ones as NAME.step.K).")
@click.option("--rank", "ranks", type=click.IntRange(min=0), multiple=True,
              help="Import this rank only (repeat it for a group of ranks; default: every rank).")
@click.option("--name", "names", multiple=True,
              help="Import the dumper names matching this glob only (repeatable), e.g. 'non_intrusive__model.layers.0.*'.")
@_import_options
def import_sglang(directory, step, ranks, names, out, model, force):
    """Import SGLang's dumper output (DIRECTORY: its <dir>/<exp_name>, or <dir> with one experiment).
    Several ranks become one rank dump per rank (OUT/rank0, ...), their dims mapped so that compare
    merges the shards; values are read with torch.load(weights_only=True) only."""
    parts = sglang.read(directory, step=step, ranks=tuple(ranks) or None, names=tuple(names) or None)
    if len(parts) == 1:
        _write_import(parts[0], out, model or "plain", force)
        return
    path = importers.write_ranks(parts, out, model=model or "plain", overwrite=force)
    for note in parts[0].notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"wrote {path}: {len(parts)} rank dumps (rank0..rank{len(parts) - 1}), "
               f"{sum(len(p.tensors) for p in parts)} tensors from {parts[0].tool}")


def _one_line(text) -> str:
    return str(text).strip().replace("\r", "\\r").replace("\n", "\\n")


def main(argv=None) -> None:
    if argv is None:  # the console script: this process is the command (a test passes its arguments)

        heap.own_process()
    try:
        rv = cli.main(args=argv, prog_name="tensordiff", standalone_mode=False)
    except click.UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError" and e.ctx is not None:  # bare `tensordiff`: teach
            click.echo(e.ctx.get_help())
            sys.exit(0)
        msg = e.format_message().replace("\n", " ")
        cmd = e.ctx.command_path if e.ctx else "tensordiff"
        click.echo(f"tensordiff: usage error: {msg} (see `{cmd} --help`)", err=True)
        sys.exit(2)
    except click.exceptions.Abort as e:
        if isinstance(e.__context__, KeyboardInterrupt):  # click turns Ctrl-C into Abort
            click.echo("tensordiff: interrupted", err=True)
            sys.exit(130)
        click.echo("tensordiff: aborted", err=True)
        sys.exit(2)
    except click.ClickException as e:
        click.echo(f"tensordiff: error: {e.format_message()}", err=True)
        sys.exit(2)
    except BadInput as e:
        # one line: a newline inside the message (a file name may hold one) is shown escaped, not cut at
        click.echo(f"tensordiff: error: {_one_line(str(e)) or type(e).__name__}", err=True)
        sys.exit(2)
    except PermissionError as e:  # a file the user may not read or write: theirs to fix, not a bug
        where = f"{_one_line(e.filename)}: " if e.filename else ""
        click.echo(f"tensordiff: error: {where}permission denied ({e.strerror}); give this user access "
                   "to it or pick another path", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("tensordiff: interrupted", err=True)
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
