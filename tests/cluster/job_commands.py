"""Find the job commands written in docs and cluster files, and parse each with its job's own parser.

A command is `python -m jobs.X ...` (X may be dotted: `jobs.bench.speed`), `python jobs/X.py ...`, `cluster/submit.sh X ...` or
`[JOB=X] sbatch cluster/slurm/ray.sbatch [X] ...`, in a shell script (comments included), a YAML
value (a RayJob's entrypoint) or Markdown (code blocks and inline code). Shell continuations are
joined, the command ends at a shell operator or a closing backtick, and commands that elide
their flags (`...`, `<flags>`) are reported apart, not parsed.

Parsing never touches the file system: paths in the examples (`/mnt/shared/...`) need not exist
here, so existence and writability checks are answered "yes" while the job's parser runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pathlib
import re
import shlex
from dataclasses import dataclass
from unittest import mock

PATTERNS = [
    re.compile(r"python3? -m jobs\.(?P<job>[a-z_0-9]+(?:\.[a-z_0-9]+)*)\b(?P<rest>.*)"),
    re.compile(r"python3? jobs/(?P<job>[a-z_0-9]+(?:/[a-z_0-9]+)*)\.py\b(?P<rest>.*)"),
    re.compile(r"cluster/submit\.sh (?P<job>[a-z_0-9]+)\b(?P<rest>.*)"),
    re.compile(r"JOB=(?P<job>[a-z_0-9]+) sbatch cluster/slurm/ray\.sbatch\b(?P<rest>.*)"),
    re.compile(r"(?<!JOB=)(?<![a-z_0-9] )sbatch cluster/slurm/ray\.sbatch (?P<job>[a-z_0-9]+)\b(?P<rest>.*)"),
]
ASSIGN = re.compile(r'^\s*([A-Z][A-Z_0-9]*)="([^"$]*(?:\$[A-Z_]+[^"$]*)*)"\s*$')
STOP = {";", "&&", "||", "|", "&", ">", ">>", "2>&1", "do", "done", "then"}


@dataclass
class Command:
    """One job command found in a file."""

    source: str
    line: int
    job: str
    argv: list[str]
    elided: bool

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: python -m jobs.{self.job} {shlex.join(self.argv)}"


def _logical_lines(text: str, *, strip_comments: bool) -> list[tuple[int, str]]:
    out, buf, start = [], "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"^\s*#+ ?", "", raw) if strip_comments else raw
        if not buf:
            start = n
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        out.append((start, buf + line))
        buf = ""
    if buf:
        out.append((start, buf))
    return out


def find_commands(path: pathlib.Path, root: pathlib.Path) -> list[Command]:
    """Job commands in one file (YAML entrypoints are read from the parsed document too)."""
    text = path.read_text(encoding="utf-8")
    rel = str(path.relative_to(root))
    if path.suffix in (".yaml", ".yml"):  # comments from the text, values from the document
        import yaml

        comments = "\n".join(line if line.lstrip().startswith("#") else "" for line in text.splitlines())
        chunks = _logical_lines(comments, strip_comments=True)
        doc = yaml.safe_load(text) or {}
        entry = (doc.get("spec") or {}).get("entrypoint") if isinstance(doc, dict) else None
        if entry:
            chunks.append((0, entry))
    else:
        chunks = _logical_lines(text, strip_comments=path.suffix != ".md")
    found, variables = [], {}
    for n, chunk in chunks:
        assign = ASSIGN.match(chunk)
        if assign:  # `P="--preset paper ..."` in a code block: later commands use "$P"
            variables[assign.group(1)] = assign.group(2)
        for name, value in variables.items():
            chunk = re.sub(rf"\${name}\b|\${{{name}}}", lambda _m, v=value: v, chunk)
        for pat in PATTERNS:
            for m in pat.finditer(chunk):
                rest = m.group("rest")
                if chunk[:m.start()].count("`") % 2 == 1:  # inline code: ends at its closing backtick
                    rest = rest.split("`", 1)[0]
                found.append(_command(rel, n, m.group("job").replace("/", "."), rest))
    return _dedupe(found)


def _command(source: str, line: int, job: str, rest: str) -> Command:
    try:
        tokens = shlex.split(rest, comments=False)
    except ValueError:  # an unbalanced quote in prose: keep the words
        tokens = rest.split()
    argv = []
    for tok in tokens:
        if tok in STOP or tok.startswith("#"):
            break
        argv.append(tok.rstrip(";"))
        if tok.endswith(";"):
            break
    # `...`/`<flags>` elide flags; a bare mention in prose (no flags at all) is no command either
    elided = not argv or any(t == "..." or t.endswith("...") or t.startswith("<") for t in argv)
    return Command(source, line, job, argv, elided)


def _dedupe(cmds: list[Command]) -> list[Command]:
    seen, out = set(), []
    for c in cmds:
        key = (c.job, tuple(c.argv))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


class Parsed(BaseException):  # not an Exception: run_job turns every Exception into one error line
    """Raised from inside an argparse-based job once its flags parsed (so `main` does no work)."""


@contextlib.contextmanager
def paths_all_exist():
    """Answer every existence/writability/GPU/keys-file question with yes (example paths, key files and GPUs live
    on clusters)."""
    from recmas_ray.config import checks, inputs

    with mock.patch.object(inputs, "path_problem", lambda *a, **k: None), \
            mock.patch.object(inputs, "model_name_problem", lambda name: None), \
            mock.patch.object(inputs, "cuda_available", lambda: True), \
            mock.patch.object(inputs, "check_keys_file", lambda flag, path: None), \
            mock.patch.object(os.path, "exists", lambda p: True), \
            mock.patch.object(os.path, "isfile", lambda p: True), \
            mock.patch.object(os.path, "isdir", lambda p: True), \
            mock.patch.object(pathlib.Path, "exists", lambda self: True), \
            mock.patch.object(checks, "writable_dir_problem", lambda p: None):
        yield


def parse_command(cmd: Command):
    """Parse `cmd.argv` with its job's parser; raise AssertionError naming the command on a bad flag.

    Jobs on the config mechanism expose `parse(argv)` (checks included); argparse jobs are parsed
    by running `main(argv)` until its `parse_args` returns.
    """
    mod = importlib.import_module(f"jobs.{cmd.job}")
    from recmas_ray.config.checks import ConfigError

    try:
        with paths_all_exist():
            if hasattr(mod, "parse"):
                return mod.parse(list(cmd.argv))
            real = argparse.ArgumentParser.parse_args

            def parse_then_stop(self, args=None, namespace=None):
                ns = real(self, args, namespace)
                raise Parsed(ns)

            with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop):
                try:
                    mod.main(list(cmd.argv))
                except Parsed as done:
                    return done.args[0]
            raise AssertionError(f"{cmd}: jobs.{cmd.job}.main never parsed its flags")
    except (ConfigError, ValueError) as e:
        raise AssertionError(f"{cmd}\n  -> {e}") from None
    except SystemExit as e:  # argparse's own error exit (0: a --help command, which is fine)
        if e.code in (0, None):
            return None
        raise AssertionError(f"{cmd}\n  -> argparse exited with {e.code}") from None
