"""The one mechanism that turns a job's config dataclass tree into its command line, and runs the job.

    recipe (a Python function)  ->  --config FILE (JSON/YAML)  ->  flags  ->  check_tree  ->  main(cfg)

* Every leaf field of the tree is a flag. Top-level fields get a plain flag; every nested field has its dotted
  form (`--recursion.latent_steps`), always. A nested field has a plain (short) flag too only where its class
  declares it in `SHORT_FLAGS` (`RecursionConfig.SHORT_FLAGS` holds "latent_steps": `--latent_steps`), so
  adding a field never adds or removes a flag elsewhere. The job's own names win: a top-level field or a
  job alias of that name keeps it. Two nested classes declaring the same short flag in one tree, an alias
  naming an existing flag, or `SHORT_FLAGS` naming no field is an error when the parser is built (a test
  builds every job's parser). Help text is the field's docstring, with default, choices and range.
* bool fields: `--name` / `--no_name`. list fields: space- or comma-separated values. dict fields:
  `KEY=VALUE` items (`--ckpt_override planner=DIR critic=DIR`). Optional fields accept `none`.
* `recipes` are named Python functions returning a config: `--recipe NAME` (or `--NAME`) starts from one.
* `aliases` add other spellings of a flag (the release's names), shown in help next to the canonical one.
  A config class may declare its own: `FLAG_ALIASES` (spellings every caller of the class accepts; the first
  one of a nested field without a short flag is the name its errors use, e.g. `--models` for
  `system.role_models`) and `SYSTEM_FIELDS` (the fields of its `system` section it reads; the others get
  no flag, and `check_tree` refuses a value set for one).
* A `--config` file is nested by section (`system: {style: mixture}`); a key that is no setting of its section
  (a nested field written at the top level, say) is refused with one line.
* `run_job` prints a user error as one line `error: ...` on stderr and returns 2, before any model loads
  (`--debug` shows the traceback); the job's own code raises `ValueError` for user errors found later
  and `RuntimeError` for runs that failed (exit 1).

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
from dataclasses import dataclass
from typing import Any, Callable

from recmas_ray.config.checks import ConfigError, OneOf, Range, check_tree, field_hints, split_annotated, unread_fields
from recmas_ray.config.tree import _get_path, _nested_type, _set_path, from_dict, load_config_file, to_dict

SPECIAL_FLAGS = ("config", "recipe", "print_config", "debug", "help")


@dataclass
class Leaf:
    """One leaf field of a config tree."""

    path: str
    """Dotted path from the root config, e.g. recursion.decode.top_p."""
    base: Any
    checks: tuple
    doc: str
    flags: list[str]
    short: bool = False
    """Its class declares a plain flag for it (`SHORT_FLAGS`)."""


def _field_docs(cls) -> dict[str, str]:
    """Attribute docstrings (the string literal under each field), collected over the class's MRO from the
    source at run time (where only bytecode is installed, fields have no help text)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        except (OSError, TypeError, IndexError, SyntaxError, AttributeError):
            continue
        for prev, cur in zip(body, body[1:]):
            if isinstance(prev, ast.AnnAssign) and isinstance(prev.target, ast.Name) and isinstance(cur, ast.Expr) \
                    and isinstance(cur.value, ast.Constant) and isinstance(cur.value.value, str):
                docs[prev.target.id] = " ".join(cur.value.value.split())
    return docs


def declared_short_flags(cls) -> tuple[str, ...]:
    """The fields of `cls` that get a plain flag wherever it is nested (its `SHORT_FLAGS`)."""
    names = tuple(getattr(cls, "SHORT_FLAGS", ()))
    unknown = sorted(set(names) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise AssertionError(f"{cls.__name__}.SHORT_FLAGS names no field: {unknown}")
    return names


def leaves(cls, prefix: str = "") -> list[Leaf]:
    """Every leaf field of the tree rooted at `cls`, depth first, flags not yet assigned."""
    hints, docs, out = field_hints(cls), _field_docs(cls), []
    short = declared_short_flags(cls) if prefix else ()
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        nested = _nested_type(hints[f.name])
        if nested is not None:
            out += leaves(nested, prefix + f.name + ".")
        else:
            base, checks = split_annotated(hints[f.name])
            out.append(Leaf(prefix + f.name, base, checks, docs.get(f.name, ""), [], f.name in short))
    return out


def assign_flags(cls, aliases: dict[str, str] | None = None, hidden=()) -> list[Leaf]:
    """Leaves with their flag names; `aliases` maps extra flag names to a field's dotted path or plain flag;
    `hidden` dotted paths get no flag (the job sets them itself). The class's `FLAG_ALIASES` and unread
    `system` fields (`SYSTEM_FIELDS`) add to them."""
    # The class's own: the spellings of its fields that every caller accepts, the fields it never reads.
    own = dict(getattr(cls, "FLAG_ALIASES", {}))
    aliases = {**own, **(aliases or {})}
    hidden = set(hidden) | set(unread_fields(cls))
    out = [leaf for leaf in leaves(cls) if leaf.path not in hidden]
    top = {leaf.path for leaf in out if "." not in leaf.path}
    declared: dict[str, str] = {}  # short flag -> the dotted path whose class declares it
    for leaf in out:
        short = leaf.path.rsplit(".", 1)[-1]
        if "." not in leaf.path:
            leaf.flags.append(short)
            continue
        if leaf.short and short not in top and short not in aliases:
            if short in declared:
                raise AssertionError(f"--{short} is declared (SHORT_FLAGS) for both --{declared[short]} and "
                                     f"--{leaf.path} in {cls.__name__}; drop one of the declarations")
            declared[short] = leaf.path
            leaf.flags.append(short)
        leaf.flags.append(leaf.path)
    by_flag = {flag: leaf for leaf in out for flag in leaf.flags}
    for alias, target in aliases.items():
        if alias in by_flag:
            raise AssertionError(f"alias --{alias} of {cls.__name__} is already the flag of --{by_flag[alias].path}")
        leaf = by_flag.get(target) or next((lf for lf in out if lf.path == target), None)
        if leaf is None:
            raise AssertionError(f"alias --{alias} names no field {target!r} of {cls.__name__}")
        if alias in own and leaf.flags[0] == leaf.path and "." in leaf.path:
            leaf.flags.insert(0, alias)  # the class's name for a nested field without a short flag: errors use it
        else:
            leaf.flags.append(alias)
    return out


# ----------------------------------------------------------------------------- value parsing
def _optional_inner(base):
    args = typing.get_args(base)
    if args and type(None) in args and typing.get_origin(base) is not typing.Literal:
        inner = [a for a in args if a is not type(None)]
        return inner[0] if len(inner) == 1 else None, True
    return base, False


def _scalar(kind, text: str):
    """Parse one scalar of `kind`; errors say what was expected."""
    if kind is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    return text


def parse_text(base, text: str):
    """A flag's text (or a list of texts for list/dict fields) as a value of the field's type."""
    base, optional = _optional_inner(base)
    if optional and isinstance(text, str) and text.lower() in ("none", "null"):
        return None
    origin = typing.get_origin(base)
    if origin is typing.Literal:
        return text
    if origin in (list, tuple):
        (kind, *_) = typing.get_args(base) or (str,)
        items = [t.strip() for chunk in text for t in str(chunk).split(",") if t.strip()]
        return [_scalar(kind, t) for t in items]
    if origin is dict:
        _, kind = typing.get_args(base) or (str, str)
        out = {}
        for item in (t.strip() for chunk in text for t in str(chunk).split(",") if t.strip()):
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise argparse.ArgumentTypeError(f"item {item!r} is not KEY=VALUE")
            out[key] = _scalar(kind, value)
        return out
    return _scalar(base, text)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block; run_job prints it
        raise ConfigError(message)


def build_parser(cls, *, prog: str | None = None, description: str | None = None,
                 aliases: dict[str, str] | None = None, recipes: dict[str, Callable] | None = None,
                 defaults=None, hidden=()) -> tuple[argparse.ArgumentParser, list[Leaf]]:
    """The argparse parser of a config class (values land in `vars(ns)` under dotted paths)."""
    p = _Parser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                allow_abbrev=False, usage="%(prog)s [--config FILE] [--FLAG VALUE ...]  (all flags below)")
    groups: dict[str, argparse._ArgumentGroup] = {}
    tree_leaves = assign_flags(cls, aliases, hidden)
    for leaf in tree_leaves:
        section = leaf.path.rsplit(".", 1)[0] if "." in leaf.path else ""
        if section not in groups:
            groups[section] = p.add_argument_group(f"{section} settings" if section else "settings")
        g = groups[section]
        default = _get_path(defaults, leaf.path) if defaults is not None else _field_default(cls, leaf.path)
        help_ = _help(leaf, default)
        inner, _ = _optional_inner(leaf.base)
        if inner is bool:  # the flag that changes the default carries the help
            on = default is not True
            g.add_argument(*[f"--{f}" for f in leaf.flags], dest=leaf.path, action="store_const", const=True,
                           default=argparse.SUPPRESS, help=help_ if on else argparse.SUPPRESS)
            g.add_argument(*[f"--no_{f}" for f in leaf.flags], dest=leaf.path, action="store_const", const=False,
                           default=argparse.SUPPRESS, help=argparse.SUPPRESS if on else help_)
            continue
        origin = typing.get_origin(inner)
        multi = origin in (list, tuple, dict)
        g.add_argument(*[f"--{f}" for f in leaf.flags], dest=leaf.path, default=argparse.SUPPRESS, help=help_,
                       nargs="+" if multi else None, metavar=_metavar(leaf),
                       type=(lambda t, b=leaf.base: t) if multi else (lambda t, b=leaf.base: parse_text(b, t)))
    p.add_argument("--config", metavar="FILE", help="JSON or YAML file with any of these settings, nested by "
                   "section (a run's saved config.json works); flags given here override it")
    if recipes:
        p.add_argument("--recipe", choices=sorted(recipes), help="named configuration to start from: "
                       + "; ".join(f"{k}: {_first_line(v.__doc__)}" for k, v in sorted(recipes.items())))
        taken = {flag for leaf in tree_leaves for flag in leaf.flags}
        for name in sorted(set(recipes) - taken):  # `--quick` is short for `--recipe quick`
            p.add_argument(f"--{name}", dest="recipe", action="store_const", const=name,
                           help=f"same as --recipe {name}")
    p.add_argument("--print_config", action="store_true", help="print the resolved config as JSON and exit")
    p.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    return p, tree_leaves


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if doc and doc.strip() else ""


def _metavar(leaf: Leaf) -> str:
    inner, _ = _optional_inner(leaf.base)
    origin = typing.get_origin(inner)
    if origin is dict:
        return "KEY=VALUE"
    if origin is typing.Literal:
        return "{" + ",".join(map(str, typing.get_args(inner))) + "}"
    return leaf.path.rsplit(".", 1)[-1].upper()


def _help(leaf: Leaf, default) -> str:
    notes = []
    for check in leaf.checks:
        if isinstance(check, OneOf):
            notes.append("choices: " + ", ".join(map(str, check.values())))
        elif isinstance(check, Range):
            notes.append(check.describe("range").replace("range in ", "range "))
    if default is dataclasses.MISSING:
        notes.append("required")
    else:
        shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else \
            " ".join(f"{k}={v}" for k, v in default.items()) if isinstance(default, dict) else default
        if isinstance(default, bool):
            shown = "on" if default else "off"
        notes.append(f"default: {shown if shown not in ('', None) else 'none'}")
    return f"{leaf.doc} ({'; '.join(notes)})".replace("%", "%%")


def _field_default(cls, path: str):
    """The declared default of a dotted field path (MISSING when the field is required)."""
    head, _, rest = path.partition(".")
    f = next(f for f in dataclasses.fields(cls) if f.name == head)
    if rest:
        if f.default_factory is not dataclasses.MISSING:  # the job's own defaults of the section
            try:
                return _get_path(f.default_factory(), rest)
            except TypeError:  # a section with required fields
                pass
        return _field_default(_nested_type(field_hints(cls)[head]), rest)
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING


def _try_default(cls):
    try:
        return cls()
    except TypeError:  # required fields
        return None


def parse_config(cls, argv=None, *, prog=None, description=None, aliases=None, recipes=None, hidden=(), start=None):
    """(config, parsed namespace) from argv: recipe, then --config file, then flags; checked once, as a whole.
    `start(cfg)`: the recipe that the file and flags of `cfg` apply over instead (None: keep `cfg`), e.g. a
    protocol's config for the style and dataset they name."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p, tree_leaves = build_parser(cls, prog=prog, description=description, aliases=aliases, recipes=recipes,
                                  hidden=hidden)
    ns = p.parse_args(argv)
    cfg = recipes[ns.recipe]() if recipes and getattr(ns, "recipe", None) else None

    data: dict = load_config_file(ns.config) if ns.config else {}
    flat = {k: v for k, v in vars(ns).items() if k not in SPECIAL_FLAGS}
    flag_of = {leaf.path: "--" + leaf.flags[0] for leaf in tree_leaves}
    for leaf in tree_leaves:
        if leaf.path in flat:
            value = flat[leaf.path]
            if isinstance(value, list):  # list/dict flags: parse their items now, naming the flag on error
                try:
                    value = parse_text(leaf.base, value)
                except argparse.ArgumentTypeError as e:
                    raise ConfigError(f"argument {flag_of[leaf.path]}: {e}") from None
            _set_path(data, leaf.path, value)
    base = cfg if cfg is not None else _try_default(cls)
    where = "config" if not ns.config else f"--config {ns.config}"
    cfg = from_dict(cls, data, base=base, where=where)
    recipe = start(cfg) if start is not None else None
    if recipe is not None:
        cfg = from_dict(cls, data, base=recipe, where=where)
    check_tree(cfg, lambda path: flag_of.get(path, "--" + path))
    return cfg, ns


def run_job(main: Callable[[Any], int | None], cls, argv=None, *, prog=None, description=None, aliases=None,
            recipes=None, hidden=(), start=None) -> int:
    """Parse, check and run one job; returns its exit status (2 user error, 1 failed run, 0 done).

    Every exception becomes one line on stderr (`--debug` re-raises it with its traceback): ValueError and
    TypeError (the user's input) exit 2, anything else (a failed run, a full disk, out of memory) exits 1.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        cfg, ns = parse_config(cls, argv, prog=prog, description=description, aliases=aliases, recipes=recipes,
                               hidden=hidden, start=start)
        if ns.print_config:
            print(json.dumps(to_dict(cfg), indent=2, sort_keys=True))
            return 0
        return int(main(cfg) or 0)
    except SystemExit as e:  # --help, or a job that exits itself
        return int(e.code or 0) if not isinstance(e.code, str) else (print(e.code, file=sys.stderr) or 2)
    except KeyboardInterrupt:
        if debug:
            raise
        print("error: interrupted; whatever finished is on disk (rerun with --resume)", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the promise: one line, never a traceback without --debug
        if debug:
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
    if isinstance(e, OSError):
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        if e.errno == errno.ENOSPC:
            return (f"no space left on the device{where}; what finished is on disk: free space and rerun with "
                    "--resume")
        return f"{e.strerror or _one_line(e)}{where} (rerun with --debug for the traceback)"
    if isinstance(e, MemoryError):
        return "out of memory; lower --batch_size or the input size (rerun with --debug for the traceback)"
    return f"{type(e).__name__}: {_one_line(e)} (rerun with --debug for the traceback)"


def _one_line(e: BaseException) -> str:
    """The message of `e` on one line; a message that embeds a traceback (Ray's errors) keeps only its
    final line, the exception itself."""
    text = str(e)
    if "Traceback (most recent call last)" in text:
        tail = [ln.strip() for ln in text.splitlines() if ln.strip()]
        head = text.split("Traceback (most recent call last)")[0].strip()
        last = tail[-1] if tail else ""
        text = f"{head.splitlines()[0]} {last}" if head and head.splitlines()[0] not in last else last
    return " ".join(text.split()) or type(e).__name__
