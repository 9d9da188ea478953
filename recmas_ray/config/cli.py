"""The one mechanism that turns a job's config dataclass tree into its command line, and runs the job.

    recipe (a Python function)  ->  --config FILE (JSON/YAML)  ->  flags  ->  check_tree  ->  main(cfg)

* Every leaf field is a flag: top-level fields by name, nested ones by dotted path (`--recursion.latent_steps`).
  A nested field also has its plain name where its class lists it in `SHORT_FLAGS`, so adding a field never
  adds or removes a flag elsewhere; a top-level field or alias of that name keeps it. `FLAG_ALIASES` (other
  spellings, e.g. the release's names; the first one of a nested field without a plain flag names it in
  errors: `--models` for `system.role_models`) and `SYSTEM_FIELDS` (the `system` fields a job reads; the
  others get no flag) are declared on the config class too. Clashes are errors when the parser is built (a
  test builds every job's parser). Help text is each field's docstring, read from the source at run time.
* bool: `--name` / `--no_name`; list: space- or comma-separated; dict: `KEY=VALUE` items; Optional: `none`.
* Recipes are Python functions returning a config: `--recipe NAME` (or `--NAME`) starts from one, and a job's
  `start(cfg)` may choose one from the settings given (`--protocol reference`); the file and flags apply
  over it. Where a setting came from is the difference between the recipe and the final config.
* `run_job` prints a user error as one line `error: ...` on stderr and returns 2 before any model loads
  (`--debug` shows the traceback); a failed run exits 1.

Nothing here imports torch or Ray, so `--help` is instant.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import sys
import textwrap
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from recmas_ray.config.checks import (ConfigError, OneOf, Range, check_tree, field_hints, split_annotated,
                                      unread_fields)
from recmas_ray.config.tree import _nested_type, _set_path, from_dict, load_config_file, to_dict

MISSING = dataclasses.MISSING


@dataclass
class Leaf:
    """One leaf field of a config tree: its dotted path, type, checks, help, default and flags."""

    path: str
    base: Any
    checks: tuple
    doc: str
    default: Any
    short: bool
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


def _default(f: dataclasses.Field):
    if f.default is not MISSING:
        return f.default
    try:
        return f.default_factory() if f.default_factory is not MISSING else MISSING
    except TypeError:  # a section with required fields
        return MISSING


def leaves(cls, prefix: str = "", inst=None) -> list[Leaf]:
    """Every leaf field of the tree rooted at `cls`, depth first, with its default (from `inst`, the parent's
    default of this section, where there is one); flags not yet assigned."""
    hints, docs, out = field_hints(cls), field_docs(cls), []
    short = set(getattr(cls, "SHORT_FLAGS", ())) if prefix else set()
    assert short <= {f.name for f in dataclasses.fields(cls)}, \
        f"{cls.__name__}.SHORT_FLAGS names no field: {sorted(short - {f.name for f in dataclasses.fields(cls)})}"
    for f in (f for f in dataclasses.fields(cls) if f.init):
        default = getattr(inst, f.name) if inst is not None else _default(f)
        nested = _nested_type(hints[f.name])
        if nested is not None:
            out += leaves(nested, prefix + f.name + ".", default if default is not MISSING else None)
        else:
            base, checks = split_annotated(hints[f.name])
            out.append(Leaf(prefix + f.name, base, checks, docs.get(f.name, ""), default, f.name in short))
    return out


def assign_flags(cls, hidden=()) -> list[Leaf]:
    """Leaves with their flag names; `hidden` dotted paths (the job sets them itself) and the `system` fields
    the class does not read get none; the class's `FLAG_ALIASES` map extra names to a path or a flag."""
    hidden = set(hidden) | set(unread_fields(cls))
    aliases = dict(getattr(cls, "FLAG_ALIASES", {}))
    out = [leaf for leaf in leaves(cls) if leaf.path not in hidden]
    top, declared = {leaf.path for leaf in out if "." not in leaf.path}, {}
    for leaf in out:
        name = leaf.path.rsplit(".", 1)[-1]
        if "." in leaf.path and leaf.short and name not in top and name not in aliases:
            assert name not in declared, (f"--{name} is declared (SHORT_FLAGS) for both --{declared[name]} and "
                                          f"--{leaf.path} in {cls.__name__}; drop one of the declarations")
            declared[name] = leaf.path
            leaf.flags.append(name)
        leaf.flags.append(leaf.path)
    by_flag = {flag: leaf for leaf in out for flag in leaf.flags}
    for alias, target in aliases.items():
        assert alias not in by_flag, f"alias --{alias} of {cls.__name__} is already the flag of --{by_flag[alias].path}"
        assert target in by_flag, f"alias --{alias} names no field {target!r} of {cls.__name__}"
        leaf = by_flag[target]  # the first alias of a nested field without a plain flag names it in errors
        leaf.flags.insert(0 if leaf.flags[0] == leaf.path and "." in leaf.path else len(leaf.flags), alias)
    return out


# ----------------------------------------------------------------------------- value parsing
def _optional_inner(base):
    args = typing.get_args(base)
    if args and type(None) in args and typing.get_origin(base) is not typing.Literal:
        inner = [a for a in args if a is not type(None)]
        return inner[0] if len(inner) == 1 else None, True
    return base, False


_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
_EXPECTED = {int: "an integer", float: "a number"}


def _scalar(kind, text: str):
    """Parse one scalar of `kind`; errors say what was expected."""
    if kind is bool:
        if text.lower() not in _WORDS:
            raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
        return _WORDS[text.lower()]
    try:
        return kind(text) if kind in _EXPECTED else text
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {_EXPECTED[kind]}, got {text!r}") from None


def parse_text(base, text):
    """A flag's text (or a list of texts for list/dict fields) as a value of the field's type."""
    base, optional = _optional_inner(base)
    if optional and isinstance(text, str) and text.lower() in ("none", "null"):
        return None
    origin = typing.get_origin(base)
    if origin not in (list, tuple, dict):
        return text if origin is typing.Literal else _scalar(base, text)
    items = [t.strip() for chunk in text for t in str(chunk).split(",") if t.strip()]
    if origin is not dict:
        return [_scalar((typing.get_args(base) or (str,))[0], t) for t in items]
    kind, out = (typing.get_args(base) or (str, str))[1], {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"item {item!r} is not KEY=VALUE")
        out[key] = _scalar(kind, value)
    return out


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block; run_job prints it
        raise ConfigError(message)


def _help(leaf: Leaf) -> str:
    notes = ["choices: " + ", ".join(map(str, c.values())) for c in leaf.checks if isinstance(c, OneOf)]
    notes += [c.describe("range").replace("range in ", "range ") for c in leaf.checks if isinstance(c, Range)]
    d = leaf.default
    shown = ("on" if d else "off") if isinstance(d, bool) else ",".join(map(str, d)) if isinstance(d, (list, tuple)) \
        else " ".join(f"{k}={v}" for k, v in d.items()) if isinstance(d, dict) else d
    notes.append("required" if d is MISSING else f"default: {shown if shown not in ('', None) else 'none'}")
    return f"{leaf.doc} ({'; '.join(notes)})".replace("%", "%%")


def build_parser(cls, *, prog=None, description=None, recipes=None, hidden=()) -> tuple[argparse.ArgumentParser,
                                                                                         list[Leaf]]:
    """The argparse parser of a config class (values land in `vars(ns)` under dotted paths)."""
    p = _Parser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                allow_abbrev=False, usage="%(prog)s [--config FILE] [--FLAG VALUE ...]  (all flags below)")
    groups: dict[str, argparse._ArgumentGroup] = {}
    tree_leaves = assign_flags(cls, hidden)
    for leaf in tree_leaves:
        section = leaf.path.rpartition(".")[0]
        g = groups.get(section) or groups.setdefault(section, p.add_argument_group(f"{section} settings".strip()))
        inner, _ = _optional_inner(leaf.base)
        names, kw = [f"--{f}" for f in leaf.flags], dict(dest=leaf.path, default=argparse.SUPPRESS)
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


def parse_config(cls, argv=None, *, prog=None, description=None, recipes=None, hidden=(), start=None):
    """(config, parsed namespace) from argv: recipe, then --config file, then flags; checked once, as a whole.
    `start(cfg)`: the recipe that the file and flags of `cfg` apply over instead (None: keep `cfg`), e.g. a
    protocol's config for the style and dataset they name."""
    p, tree_leaves = build_parser(cls, prog=prog, description=description, recipes=recipes, hidden=hidden)
    ns = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    data: dict = load_config_file(ns.config) if ns.config else {}
    flag_of = {leaf.path: "--" + leaf.flags[0] for leaf in tree_leaves}
    for leaf in (leaf for leaf in tree_leaves if leaf.path in vars(ns)):
        value = getattr(ns, leaf.path)
        if isinstance(value, list):  # list/dict flags: parse their items now, naming the flag on error
            try:
                value = parse_text(leaf.base, value)
            except argparse.ArgumentTypeError as e:
                raise ConfigError(f"argument {flag_of[leaf.path]}: {e}") from None
        _set_path(data, leaf.path, value)
    where = f"--config {ns.config}" if ns.config else "config"
    recipe = recipes[ns.recipe]() if getattr(ns, "recipe", None) else None
    if recipe is None:
        try:
            recipe = cls()
        except TypeError:  # required fields: the file or the flags give them
            pass
    cfg = from_dict(cls, data, base=recipe, where=where)
    if start is not None and (recipe := start(cfg)) is not None:
        cfg = from_dict(cls, data, base=recipe, where=where)
    check_tree(cfg, lambda path: flag_of.get(path, "--" + path))
    return cfg, ns


def run_job(main: Callable[[Any], int | None], cls, argv=None, *, prog=None, description=None, recipes=None,
            hidden=(), start=None) -> int:
    """Parse, check and run one job; returns its exit status (2 user error, 1 failed run, 0 done).

    Every exception becomes one line on stderr (`--debug` re-raises it with its traceback): ValueError and
    TypeError (the user's input) exit 2, anything else (a failed run, a full disk, out of memory) exits 1.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg, ns = parse_config(cls, argv, prog=prog, description=description, recipes=recipes, hidden=hidden,
                               start=start)
        if ns.print_config:
            print(json.dumps(to_dict(cfg), indent=2, sort_keys=True))
            return 0
        return int(main(cfg) or 0)
    except SystemExit as e:  # --help, or a job that exits itself
        return int(e.code or 0) if not isinstance(e.code, str) else (print(e.code, file=sys.stderr) or 2)
    except KeyboardInterrupt:
        if "--debug" in argv:
            raise
        print("error: interrupted; whatever finished is on disk (rerun with --resume)", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the promise: one line, never a traceback without --debug
        if "--debug" in argv:
            raise
        print(f"error: {describe_error(e)}", file=sys.stderr)
        return 2 if isinstance(e, (ValueError, TypeError)) else 1


def describe_error(e: BaseException) -> str:
    """One line for any exception: user errors as they are, a full disk / missing memory / other OS error named
    with its fix, anything else with its type and the `--debug` hint."""
    import errno

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
        last = tail[-1] if tail else ""
        text = f"{head[0]} {last}" if head and head[0] not in last else last
    return " ".join(text.split()) or type(e).__name__
