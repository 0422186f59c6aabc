"""The `tensordiff` command line.

Exit status everywhere: 0 all within tolerance, 1 a material divergence, 2 bad input or usage
(one line on stderr, no traceback).
"""
from __future__ import annotations

import sys
from pathlib import Path

import click

from . import __version__
from .errors import BadInput

EPILOG_COMPARE = """\b
Exit status: 0 every boundary within tolerance, 1 a material divergence, 2 bad input.
Examples:
  tensordiff compare dumps/sample-oracle dumps/sample-engine
  tensordiff compare oracle/ engine/ --json report.json --tolerances tol.toml
"""


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


def _writable(path: Path | None) -> None:
    """Refuse an output path we could not write before doing any work."""
    if path is None:
        return
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise BadInput(f"cannot write {path}: directory {parent} does not exist")
    import os

    if not os.access(parent, os.W_OK) or (Path(path).exists() and not os.access(path, os.W_OK)):
        raise BadInput(f"cannot write {path}: permission denied")
    if Path(path).is_dir():
        raise BadInput(f"cannot write {path}: it is a directory")


def _emit_report(report, json_path) -> int:
    from .report import print_rich, render_text, write_json

    if json_path:
        write_json(report, json_path)
    if sys.stdout.isatty():
        print_rich(report, _console())
    else:
        click.echo(render_text(report))
    return 0 if report.verdict == "match" else 1


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="tensordiff")
def cli():
    """Run an inference engine beside the official PyTorch oracle, compare tensors at named
    boundaries, and name the EARLIEST material divergence.

    \b
    Start here:
      tensordiff check deepseek-v4.1-flash        # oracle + engine on the embedded image
      tensordiff faults                           # planted bugs, and where each must be caught
      tensordiff check qwen3-vl --fault rope-hw-swap
      tensordiff compare DIR_A DIR_B --json r.json
    """


@cli.command(epilog=EPILOG_COMPARE)
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Also write the machine report here.")
@click.option("--tolerances", type=click.Path(path_type=Path),
              help="TOML tolerance file (default: [tool.tensordiff] of the nearest pyproject.toml).")
@click.option("--fail-fast", is_flag=True, help="Stop at the first diverged boundary (in DAG order).")
@click.option("--verify", is_flag=True, help="Check every tensor's sha256 while streaming it.")
def compare(a, b, json_path, tolerances, fail_fast, verify):
    """Compare dump A (reference, e.g. the oracle) with dump B (candidate, e.g. your engine)."""
    from .compare import compare_dumps
    from .dump import open_dump

    _writable(json_path)
    da, db = open_dump(a), open_dump(b)
    prog, cb = _progress_factory(da.nbytes + db.nbytes, "comparing")
    if prog:
        with prog:
            report = compare_dumps(da, db, tolerances, fail_fast=fail_fast, verify=verify, progress=cb)
    else:
        report = compare_dumps(da, db, tolerances, fail_fast=fail_fast, verify=verify)
    sys.exit(_emit_report(report, json_path))


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--verify", is_flag=True, help="Read every tensor and check its sha256.")
def inspect(directory, verify):
    """List a dump's model, producer, run and tensors (reads no tensor data unless --verify)."""
    import hashlib

    from .dump import open_dump

    d = open_dump(directory)
    click.echo(f"dump {d.path}: model {d.model}, producer {d.producer}")
    for k, v in d.run.items():
        click.echo(f"  run.{k}: {v}")
    click.echo(f"{'tensor':<28} {'boundary':<16} {'dtype':<9} {'shape':<20} {'MB':>9}  file")
    bad = 0
    for e in d.entries:
        status = ""
        if verify:
            h = hashlib.sha256()
            r = e.stored.reader()
            try:
                for s in range(0, e.stored.numel, 1 << 22):
                    h.update(r.read(s, min(e.stored.numel, s + (1 << 22))).tobytes())
            finally:
                r.close()
            ok = e.sha256 is None or h.hexdigest() == e.sha256
            status = "  sha256 ok" if ok and e.sha256 else ("  no sha256" if ok else "  SHA256 MISMATCH")
            bad += not ok
        click.echo(f"{e.name:<28} {e.boundary:<16} {e.dtype.name:<9} {str(list(e.shape)):<20} "
                   f"{e.stored.nbytes / 1e6:>9.3f}  {e.stored.file.name}:{e.stored.key}{status}")
    click.echo(f"{len(d.entries)} tensors, {d.nbytes / 1e6:.1f} MB")
    if bad:
        raise BadInput(f"{bad} tensor(s) in {d.path} fail their sha256: the files are corrupt")


def _model_options(f):
    opts = [
        click.option("--image", type=click.Path(path_type=Path), default=None,
                     help="Input image (default: the embedded 1024x701 test picture)."),
        click.option("--weights", default="synthetic:tiny", show_default=True,
                     help="synthetic:tiny | synthetic:full | synthetic:<variant> | a checkpoint directory."),
        click.option("--device", default="cpu", show_default=True, help="cpu or cuda[:N]."),
        click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True),
        click.option("--backend", type=click.Choice(["torch", "hip"]), default="torch", show_default=True,
                     help="Engine kernels: torch reference ops or compiled HIP kernels (needs a GPU)."),
        click.option("--fault", default=None, help="Plant a named engine fault (see `tensordiff faults`)."),
        click.option("--prompt", default=None, help="Text around the image; `<image>` marks where it goes."),
        click.option("--chunk", type=click.IntRange(min=1), default=None, help="Engine prefill chunk length."),
        click.option("--decode", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Decode steps after the prompt."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@cli.command()
@click.argument("model")
@click.option("--side", type=click.Choice(["oracle", "engine"]), required=True)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Dump directory to create.")
@click.option("--format", "fmt", type=click.Choice(["safetensors", "hdf5"]), default="safetensors", show_default=True)
@click.option("--force", is_flag=True, help="Replace an existing dump at --out.")
@_model_options
def dump(model, side, out, fmt, force, **kw):
    """Run one side of MODEL on an image and write its boundary tensors to a dump directory."""
    from .runs import make_request, run_side

    adapter, req = make_request(model, **kw)
    if side == "oracle" and req.fault:
        raise BadInput("--fault plants an engine bug; the oracle has none")
    path = run_side(adapter, side, req, out, fmt=fmt, overwrite=force)
    click.echo(f"wrote {path}")


@cli.command()
@click.argument("model")
@_model_options
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Also write the machine report here.")
@click.option("--tolerances", type=click.Path(path_type=Path), help="TOML tolerance file.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Keep both dumps under this directory (oracle/ and engine/).")
@click.option("--oracle-dtype", type=click.Choice(["float32", "bfloat16"]), default=None,
              help="Run the oracle at another dtype than the engine (default: the engine's dtype).")
@click.option("--no-cache", is_flag=True, help="Run the oracle even when a cached dump for these inputs exists.")
def check(model, json_path, tolerances, out, oracle_dtype, no_cache, **kw):
    """Run the oracle and the engine on one image, compare, and name the earliest divergence."""
    from .runs import check as run_check

    _writable(json_path)

    report = run_check(model, json_path=json_path, tolerances=tolerances, out=out, oracle_dtype=oracle_dtype,
                       use_cache=not no_cache, **kw)
    sys.exit(_emit_report(report, json_path))


@cli.command()
@click.argument("model", required=False)
def faults(model):
    """List the named faults the engine can carry and the boundary each must trip."""
    from . import registry

    names = [model] if model else registry.names()
    if not names:
        raise BadInput("no model adapters are installed")
    for n in names:
        a = registry.adapter(n)
        click.echo(f"{a.name}:")
        for f in a.faults:
            click.echo(f"  {f.name:<32} -> {f.boundary:<16} {f.description}")


def main(argv=None) -> None:
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
    except click.exceptions.Abort:
        click.echo("tensordiff: aborted", err=True)
        sys.exit(2)
    except click.ClickException as e:
        click.echo(f"tensordiff: error: {e.format_message()}", err=True)
        sys.exit(2)
    except BadInput as e:
        click.echo(f"tensordiff: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("tensordiff: interrupted", err=True)
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
