"""Training data shared by inner- and outer-loop training: loading, role names, targets and prompts.

Rows are plain dicts (`question` plus one gold text per role). Everything a
trainer needs from a row goes through here, so the inner and outer loops agree on which field is a
role's target, how upstream gold texts fill a role's prompt slots, and which rows are rejected.

Datasets: a local `.json` / `.jsonl` file (`{"data": [...]}` wrapped JSON via `json_field`), a
Hugging Face dataset id (train split, via `datasets.load_dataset`), `synthetic[:N]` for the
offline multi-step arithmetic set of `recmas_ray.train.synthetic` (N rows, default 256), or
`synthetic_short[:N]` for the same with short answer targets, `synthetic_hidden[:N]` for its hidden-operand
set (only the planner is told the fact) and `synthetic_recall[:N]` for the hidden fact recalled ("What is x?"). A row's optional
`role_context` ({role: text}) is attached to its question by `question_text`; the renderer shows each
role its own part.
"""

from __future__ import annotations

import json
from pathlib import Path

from recmas_ray.config.inputs import parse_json_lines, read_text_file
from recmas_ray.styles import StyleSpec, render_prompt, split_edge
from recmas_ray.styles.role_context import with_role_context
from recmas_ray.tasks import TASK_TYPES
from recmas_ray.train.synthetic import make_arithmetic_dataset

# Role names of the original training tool (`--mas_role`) -> recmas_ray role names.
SYNTHETIC_PREFIX = "synthetic"
SYNTHETIC_HIDDEN_PREFIX = "synthetic_hidden"
DEFAULT_SYNTHETIC_ROWS = 256
SYNTHETIC_DATASETS = {SYNTHETIC_PREFIX: {"difficulty": "multi"},
                      "synthetic_short": {"difficulty": "multi", "short_answers": True},
                      SYNTHETIC_HIDDEN_PREFIX: {"difficulty": "hidden"},
                      "synthetic_recall": {"difficulty": "hidden_recall"}}
"""Generated dataset name -> arguments of `recmas_ray.train.synthetic.make_arithmetic_dataset`."""


def load_rows(dataset_name: str, json_field: str | None = None, *, split: str = "train") -> list[dict]:
    """Rows of a local .json/.jsonl file, `synthetic[:N]`, or a Hugging Face dataset id (`split`)."""
    if not dataset_name:
        raise ValueError("empty dataset name; expected a .json/.jsonl path, synthetic[:N] or a HF dataset id")
    if dataset_name.partition(":")[0] in SYNTHETIC_DATASETS:
        return _synthetic_rows(dataset_name)
    path = Path(dataset_name)
    if path.suffix in (".json", ".jsonl"):
        if not path.is_file():
            raise ValueError(f"dataset file {dataset_name!r} does not exist")
        return _json_rows(path, json_field)
    from datasets import load_dataset  # lazy: ~2 s with pyarrow and pandas: only a dataset id from the Hub needs it

    try:
        return [dict(r) for r in load_dataset(dataset_name, split=split)]
    except Exception as e:  # noqa: BLE001 - hub, network and split errors of the user's dataset id: one line
        raise ValueError(f"dataset {dataset_name!r} (split {split!r}) could not be loaded: "
                         f"{' '.join(str(e).split())[:300]}") from None


def _synthetic_rows(name: str) -> list[dict]:
    prefix, _, count = name.partition(":")
    try:
        num_rows = int(count) if count else DEFAULT_SYNTHETIC_ROWS
    except ValueError:
        raise ValueError(f"dataset {name!r}: expected {prefix} or {prefix}:N with an integer N") from None
    if num_rows < 1:
        raise ValueError(f"dataset {name!r}: the number of rows must be >= 1")
    return make_arithmetic_dataset(num_rows, seed=0, **SYNTHETIC_DATASETS[prefix])


def _json_rows(path: Path, json_field: str | None) -> list[dict]:
    text = read_text_file("--dataset_name", path)
    if path.suffix == ".jsonl":
        data = parse_json_lines(text, str(path))
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e}); expected a list of row objects (or an object "
                             "holding one, --dataset_json_field)") from None
    if json_field:
        if not isinstance(data, dict) or json_field not in data:
            keys = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"{path}: no field {json_field!r} at the top level (found {keys})")
        data = data[json_field]
    elif isinstance(data, dict):
        raise ValueError(f"{path}: top level is an object with keys {sorted(data)}; pass the field holding "
                         f"the rows (--dataset_json_field, e.g. 'data')")
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ValueError(f"{path}: expected a list of row objects")
    return data


def _state(row: dict, field: str) -> str:
    """Why a row's field gives no text: missing, or present but null / empty (never "missing" when it is there)."""
    if field not in row:
        return "missing"
    value = row[field]
    return "null" if value is None else f"empty ({json.dumps(value)})"


def _present(row: dict, field: str) -> bool:
    value = row.get(field)
    return value is not None and str(value).strip() != ""


def question_text(row: dict) -> str:
    """The row's question, surrounding white space stripped (as every text field the trainers read), with its
    `role_context` attached (`styles.role_context.with_role_context`: each role's prompt shows its own part)."""
    return with_role_context(str(row["question"]).strip(), row.get("role_context"))


def role_target(style: StyleSpec, role: str, row: dict) -> str:
    """The role's gold text (stripped): the first present, non-empty field of `style.target_fields[role]`."""
    fields = style.target_fields[role]
    for field in fields:
        if _present(row, field):
            return str(row[field]).strip()
    raise ValueError(f"row has no non-empty target for role {role} of style {style.name}; "
                     f"accepted fields {list(fields)}")


def upstream_roles(style: StyleSpec, role: str, *, variant: str = "base", task: str = "math") -> list[str]:
    """Roles whose gold text fills a slot of `role`'s prompt (variant/task), in slot order."""
    template = style.prompts[role].template(variant, task)
    slots = style.slots.get(role, {})
    return [split_edge(edge)[0] for marker, edge in slots.items() if marker in template]


def teacher_prompt(style: StyleSpec, role: str, row: dict, task: str, *, variant: str = "base") -> str:
    """The role's user prompt with the upstream roles' gold texts in its slots.

    When `style.teacher_text_in_slots` is False (deliberation) the literal slot markers stay in the
    text; embed such prompts with `literal_slots=True`.
    """
    if task not in TASK_TYPES:
        raise ValueError(f"unknown task type {task!r}; expected one of {TASK_TYPES}")
    slot_text = {}
    if style.teacher_text_in_slots:
        template = style.prompts[role].template(variant, task)
        for marker, edge in style.slots.get(role, {}).items():
            if marker in template:
                slot_text[marker] = role_target(style, split_edge(edge)[0], row)
    return render_prompt(style, role, variant, task, question_text(row), slot_text)


def validate_rows(rows: list[dict], style: StyleSpec, roles, *, task: str = "math", variant: str = "base") -> None:
    """Check up front that every row has a question, each role's target and its upstream texts.

    Raises ValueError naming the first bad row's index and the field names that were accepted.
    """
    if not rows:
        raise ValueError("the dataset has no rows")
    needed = {}
    for role in roles:
        needed[role] = style.target_fields[role]
        if style.teacher_text_in_slots:
            for up in upstream_roles(style, role, variant=variant, task=task):
                needed[up] = style.target_fields[up]
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"row {i}: expected an object with fields, got {type(row).__name__}")
        if not _present(row, "question"):
            raise ValueError(f"row {i}: field 'question' is {_state(row, 'question')}; expected the question text")
        for role, fields in needed.items():
            if not any(_present(row, f) for f in fields):
                states = ", ".join(f"{f!r} {_state(row, f)}" for f in fields)
                raise ValueError(f"row {i}: no target text for role {role} (style {style.name}): {states}; expected "
                                 "one of them non-empty")


def role_examples(rows: list[dict], style: StyleSpec, role: str, task: str) -> list[tuple[str, str]]:
    """(user prompt, gold target) pairs of one role, after `validate_rows`."""
    validate_rows(rows, style, [role], task=task)
    return [(teacher_prompt(style, role, row, task), role_target(style, role, row)) for row in rows]
