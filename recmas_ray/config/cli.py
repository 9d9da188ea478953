"""The one mechanism that turns a job's config dataclass tree into its command line, and runs the job.

    recipe (a Python function)  ->  --config FILE (JSON/YAML)  ->  flags  ->  check_tree  ->  main(cfg)

Every leaf field is a flag: top-level fields by name, nested ones by dotted path (`--recursion.latent_steps`)
and by plain name where their class lists them in `SHORT_FLAGS` (unless a top-level field or alias has that
name). The job's config class may declare `FLAG_ALIASES` (other spellings; the first one of a nested field
without a plain flag names it in errors: `--models` for `system.role_models`) and `SYSTEM_FIELDS` (the `system`
fields the job reads; the others get no flag). Clashes fail when the parser is built (a test builds every job's
parser). Help is each field's docstring, read from the source at run time. bool: `--name` / `--no_name`; list:
space- or comma-separated; dict: `KEY=VALUE` items; Optional: `none`. `--recipe NAME` (or `--NAME`) starts from
a recipe, a Python function returning a config; a job's `start(cfg)` may pick one from the settings given
(`--protocol reference`); the file and flags apply over it. Nothing here imports torch or Ray.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import errno
import inspect
import json
import sys
import textwrap
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from recmas_ray import console
from recmas_ray.config.checks import KIND_NAMES, ConfigError, OneOf, Range, check_tree, field_hints, \
    split_annotated, unread_fields
from recmas_ray.config.tree import from_dict, load_config_file, set_path, to_dict

MISSING = dataclasses.MISSING


@dataclass
class Leaf:
    """One leaf field of a config tree: its dotted path, type, checks, help, default and flag names."""

    path: str
    base: Any
    checks: tuple
    doc: str
    default: Any
    flags: list[str] = field(default_factory=list)


def field_docs(cls) -> dict[str, str]:
    """Attribute docstrings (the string under each field) over the class's MRO, read from the source."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        except (OSError, TypeError, IndexError, SyntaxError, AttributeError):
            continue  # no source (builtins, bytecode-only installs): no help text
        for prev, cur in zip(body, body[1:]):
            if isinstance(prev, ast.AnnAssign) and isinstance(prev.target, ast.Name) and isinstance(cur, ast.Expr) \
                    and isinstance(cur.value, ast.Constant) and isinstance(cur.value.value, str):
                docs[prev.target.id] = " ".join(cur.value.value.split())
    return docs


def leaves(cls, prefix: str = "", inst=None) -> list[Leaf]:
    """Every leaf field under `cls`, depth first, with its default (from `inst`, the parent's default of this
    section, where there is one) and its plain name as a flag where its class lists it in `SHORT_FLAGS`."""
    hints, docs, names, out = field_hints(cls), field_docs(cls), {f.name for f in dataclasses.fields(cls)}, []
    short = set(getattr(cls, "SHORT_FLAGS", ())) if prefix else set()
    assert short <= names, f"{cls.__name__}.SHORT_FLAGS names no field: {sorted(short - names)}"
    for f in (f for f in dataclasses.fields(cls) if f.init):
        try:
            default = getattr(inst, f.name) if inst is not None else \
                f.default if f.default_factory is MISSING else f.default_factory()
        except TypeError:  # a section with required fields
            default = MISSING
        base, checks = split_annotated(hints[f.name])
        if dataclasses.is_dataclass(base):
            out += leaves(base, prefix + f.name + ".", None if default is MISSING else default)
        else:
            plain = [f.name] if f.name in short else []
            out.append(Leaf(prefix + f.name, base, checks, docs.get(f.name, ""), default, plain))
    return out


def assign_flags(cls, hidden=()) -> list[Leaf]:
    """The leaves that get flags, with their names: the plain one unless a top-level field or an alias takes it,
    the dotted path, and the class's `FLAG_ALIASES` (extra names of a path or a flag). `hidden` dotted paths (the
    job sets them itself) and the `system` fields the class does not read get none."""
    hidden, aliases = set(hidden) | set(unread_fields(cls)), dict(getattr(cls, "FLAG_ALIASES", {}))
    out, by_flag = [leaf for leaf in leaves(cls) if leaf.path not in hidden], {}
    taken = {leaf.path for leaf in out} | set(aliases)
    for leaf in out:
        leaf.flags = [name for name in leaf.flags if name not in taken] + [leaf.path]
        assert leaf.flags[0] not in by_flag, (f"--{leaf.flags[0]} is declared (SHORT_FLAGS) for both --"
                                              f"{by_flag[leaf.flags[0]].path} and --{leaf.path} in {cls.__name__}; "
                                              "drop one of the declarations")
        by_flag.update(dict.fromkeys(leaf.flags, leaf))
    for alias, target in aliases.items():
        assert alias not in by_flag, f"alias --{alias} of {cls.__name__} is already the flag of --{by_flag[alias].path}"
        assert target in by_flag, f"alias --{alias} names no field {target!r} of {cls.__name__}"
        leaf = by_flag[target]  # the first alias of a nested field without a plain flag names it in errors
        leaf.flags.insert(0 if leaf.flags[0] == leaf.path and "." in leaf.path else len(leaf.flags), alias)
    return out


_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def _scalar(kind, text: str):
    """One value of `kind` from its text; the error says what was expected."""
    try:
        return _WORDS[text.lower()] if kind is bool else kind(text) if kind in (int, float) else text
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {KIND_NAMES[kind]}, got {text!r}") from None


def _optional_inner(base):
    """(the type inside an Optional, or None where several are; whether it is Optional)."""
    args = typing.get_args(base)
    if type(None) in args and typing.get_origin(base) is not typing.Literal:
        inner = [a for a in args if a is not type(None)]
        return inner[0] if len(inner) == 1 else None, True
    return base, False


def parse_text(base, text):
    """A flag's text (a list of texts for list and dict fields) as a value of the field's type."""
    base, optional = _optional_inner(base)
    if optional and isinstance(text, str) and text.lower() in ("none", "null"):
        return None
    origin, args = typing.get_origin(base), typing.get_args(base)
    if origin not in (list, tuple, dict):
        return text if origin is typing.Literal else _scalar(base, text)
    items = [t.strip() for chunk in text for t in str(chunk).split(",") if t.strip()]
    if origin is not dict:
        return [_scalar((args or (str,))[0], t) for t in items]
    pairs = [item.partition("=") for item in items]
    bad = next(("".join(p) for p in pairs if not p[1] or not p[0]), None)
    if bad is not None:
        raise argparse.ArgumentTypeError(f"item {bad!r} is not KEY=VALUE")
    return {key: _scalar((args or (str, str))[1], value) for key, _, value in pairs}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block; run_job prints it
        raise ConfigError(message)


def _help(leaf: Leaf) -> str:
    notes = ["choices: " + ", ".join(map(str, c.values())) if isinstance(c, OneOf) else
             c.describe("range").replace("range in ", "range ") for c in leaf.checks if isinstance(c, (OneOf, Range))]
    d = leaf.default
    shown = ("on" if d else "off") if isinstance(d, bool) else ",".join(map(str, d)) if isinstance(d, (list, tuple)) \
        else " ".join(f"{k}={v}" for k, v in d.items()) if isinstance(d, dict) else d
    notes.append("required" if d is MISSING else f"default: {shown if shown not in ('', None) else 'none'}")
    return f"{leaf.doc} ({'; '.join(notes)})".replace("%", "%%")


def build_parser(cls, *, prog=None, description=None, recipes=None, hidden=()) -> tuple[_Parser, list[Leaf]]:
    """The parser of a config class (values land in `vars(ns)` under dotted paths) and its leaves."""
    p = _Parser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                allow_abbrev=False, usage="%(prog)s [--config FILE] [--FLAG VALUE ...]  (all flags below)")
    groups: dict[str, argparse._ArgumentGroup] = {}
    tree_leaves = assign_flags(cls, hidden)
    for leaf in tree_leaves:
        section = leaf.path.rpartition(".")[0]
        g = groups.get(section) or groups.setdefault(section, p.add_argument_group(f"{section} settings".strip()))
        names, kw = [f"--{f}" for f in leaf.flags], dict(dest=leaf.path, default=argparse.SUPPRESS)
        inner = _optional_inner(leaf.base)[0]
        if inner is bool:  # the flag that changes the default carries the help
            on = leaf.default is not True
            g.add_argument(*names, action="store_const", const=True, help=_help(leaf) if on else argparse.SUPPRESS, **kw)
            g.add_argument(*[f"--no_{f}" for f in leaf.flags], action="store_const", const=False,
                           help=argparse.SUPPRESS if on else _help(leaf), **kw)
            continue
        origin = typing.get_origin(inner)
        metavar = "KEY=VALUE" if origin is dict else "{" + ",".join(map(str, typing.get_args(inner))) + "}" \
            if origin is typing.Literal else leaf.path.rsplit(".", 1)[-1].upper()
        multi = origin in (list, tuple, dict)  # items parsed after argparse, naming the flag on error
        g.add_argument(*names, help=_help(leaf), nargs="+" if multi else None, metavar=metavar, **kw,
                       type=None if multi else (lambda t, b=leaf.base: parse_text(b, t)))
    p.add_argument("--config", metavar="FILE", help="JSON or YAML file with any of these settings, nested by "
                   "section (a run's saved config.json works); flags given here override it")
    if recipes:
        p.add_argument("--recipe", choices=sorted(recipes), help="named configuration to start from: " + "; ".join(
            f"{k}: {(v.__doc__ or '').strip().partition(chr(10))[0]}" for k, v in sorted(recipes.items())))
        taken = {flag for leaf in tree_leaves for flag in leaf.flags}
        for name in sorted(set(recipes) - taken):  # `--quick` is short for `--recipe quick`
            p.add_argument(f"--{name}", dest="recipe", action="store_const", const=name, help=f"same as --recipe {name}")
    p.add_argument("--print_config", action="store_true", help="print the resolved config as JSON and exit")
    p.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    return p, tree_leaves


def parse_config(cls, argv=None, *, recipes=None, start=None, **parser_kw):
    """(config, parsed namespace) from argv: recipe, then --config file, then flags; checked once, as a whole.
    `start(cfg)`: the recipe that the file and flags of `cfg` apply over instead (None: keep `cfg`), e.g. a
    protocol's config for the style and dataset they name. `parser_kw`: prog, description, hidden."""
    p, tree_leaves = build_parser(cls, recipes=recipes, **parser_kw)
    ns = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    data: dict = load_config_file(ns.config) if ns.config else {}
    flag_of = {leaf.path: "--" + leaf.flags[0] for leaf in tree_leaves}
    for leaf in (leaf for leaf in tree_leaves if leaf.path in vars(ns)):
        value = getattr(ns, leaf.path)
        try:  # list/dict flags: their items are parsed now, naming the flag on error
            set_path(data, leaf.path, parse_text(leaf.base, value) if isinstance(value, list) else value)
        except argparse.ArgumentTypeError as e:
            raise ConfigError(f"argument {flag_of[leaf.path]}: {e}") from None
    where = f"--config {ns.config}" if ns.config else "config"
    recipe = recipes[ns.recipe]() if getattr(ns, "recipe", None) else None
    if recipe is None:
        with contextlib.suppress(TypeError):  # required fields: the file or the flags give them
            recipe = cls()
    cfg = from_dict(cls, data, base=recipe, where=where)
    if start is not None and (recipe := start(cfg)) is not None:
        cfg = from_dict(cls, data, base=recipe, where=where)
    check_tree(cfg, lambda path: flag_of.get(path, "--" + path))
    return cfg, ns


def run_job(main: Callable[[Any], int | None], cls, argv=None, *, announce: bool | None = None,
            on_interrupt: str = "", **parse_kw) -> int:
    """Parse, check (`parse_config`'s keywords) and run one job; returns its exit status: 2 for the user's input
    (ValueError, TypeError), 130 interrupted (Ctrl-C, SIGINT), 1 for a failed run (anything else), 0 done. Every
    error is one line on stderr (`--debug` re-raises it with its traceback).

    `announce` (default: a command line, `argv` None): the job's first line, "checking inputs ...", goes to
    stderr at once, before the config is parsed (`console.announce`). `on_interrupt`: what the interrupt's line
    says after "interrupted; " (default: finished work is on disk, `--resume` continues)."""
    if announce is None:
        announce = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if announce:
            console.announce(argv=argv)
        cfg, ns = parse_config(cls, argv, **parse_kw)
        if ns.print_config:
            print(json.dumps(to_dict(cfg), indent=2, sort_keys=True))
            return 0
        return int(main(cfg) or 0)
    except SystemExit as e:  # --help, or a job that exits itself
        console.retract()
        return int(e.code or 0) if not isinstance(e.code, str) else (print(e.code, file=sys.stderr) or 2)
    except (KeyboardInterrupt, Exception) as e:  # noqa: BLE001 - the promise: one line, no traceback without --debug
        console.retract()
        if "--debug" in argv:
            raise
        if isinstance(e, KeyboardInterrupt):
            print(f"interrupted; {on_interrupt or RESUME_HINT}", file=sys.stderr)
            return 130
        print(f"error: {describe_error(e)}", file=sys.stderr)
        return 2 if isinstance(e, (ValueError, TypeError)) else 1
    finally:
        console.retract()


RESUME_HINT = "whatever finished is on disk (rerun with --resume)"
"""The interrupt line's default second half (jobs that stream results or checkpoints to disk)."""


def describe_error(e: BaseException) -> str:
    """One line for any exception: user errors as they are, an interruption, a full disk / missing memory / other
    OS error named with its fix, anything else with its type and the `--debug` hint."""
    if isinstance(e, KeyboardInterrupt):
        return f"interrupted; {RESUME_HINT}"
    cause = getattr(e, "cause", None)  # a Ray task/actor error: the user's exception inside it
    if isinstance(cause, BaseException) and cause is not e:
        return describe_error(cause)
    if isinstance(e, (ValueError, TypeError, RuntimeError)):
        return _one_line(e)
    hint = " (rerun with --debug for the traceback)"
    if isinstance(e, OSError):
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        if e.errno == errno.ENOSPC:
            return f"no space left on the device{where}; what finished is on disk: free space and rerun with --resume"
        return f"{e.strerror or _one_line(e)}{where}{hint}"
    if isinstance(e, MemoryError):
        return "out of memory; lower --batch_size or the input size" + hint
    return f"{type(e).__name__}: {_one_line(e)}{hint}"


def _one_line(e: BaseException) -> str:
    """The message of `e` on one line; one that embeds a traceback (Ray's errors) keeps its first line and
    its final one, the exception itself."""
    text = str(e)
    if "Traceback (most recent call last)" in text:
        head = text.split("Traceback (most recent call last)")[0].strip().splitlines()
        tail = [ln.strip() for ln in text.splitlines() if ln.strip()]
        text = f"{head[0]} {tail[-1]}" if head and head[0] not in tail[-1] else tail[-1]
    return " ".join(text.split()) or type(e).__name__
