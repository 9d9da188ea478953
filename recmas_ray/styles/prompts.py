"""Prompt sets as data: a style's prompts read from (or written to) a YAML or JSON file.

Shape (the project's own prompts are the same data, built from the style declarations):

    roles:                      # role -> variant -> task type -> template
      planner:
        base:     {math: "... {question} ...", code: "..."}
        feedback: {math: "... <<LATENT_FEEDBACK_SLOT>> ..."}
    system_prompt: "..."        # optional: the style's system prompt
    single_agent: "..."         # optional: the single-agent baseline's prompt
    final: {math: "...", ...}   # optional: the {final} instruction per task type
    interface: {functional: "... {fn_name} ...", stdin: "..."}   # optional: code-task interface lines

Templates use `{question}` and `{final}` and hold the style's slot markers where latent blocks go.
`load_prompt_set` checks a file against the style before any model loads: every role present, a
"feedback" variant exactly for roles fed by feedback edges, "math" in every variant (other task
types fall back to it), each template holding exactly the role's slots for its variant; an error
names the file, role, variant and task. `prompt_set_hash` is the identity recorded in results (and
in resume fingerprints).

Per-role context (`with_role_context` / `question_for_role`): a row may carry `role_context`, e.g.
`{"planner": "x = 17."}`, a fact only those roles are told (the hidden-operand task of
`recmas_ray.train.synthetic`). It travels inside the question text, behind a marker line, so every layer
that moves questions (Ray actors, result streams, lm-eval) carries it unchanged; the one renderer
(`styles.base.render_prompt`) shows each role its own context and strips the marker for everyone else.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

from recmas_ray.config.inputs import read_data_file
from recmas_ray.styles import get_style
from recmas_ray.styles.base import TASK_TYPES, VARIANTS, RolePrompts, StyleSpec

_SLOT_RE = re.compile(r"<<[A-Z_]+_SLOT>>")
FORMAT_VERSION = 1
OPTIONAL_KEYS = ("system_prompt", "single_agent", "final", "interface")


def prompt_set_of(style: StyleSpec) -> dict:
    """The prompt-set data of a style (its declared prompts, in the file shape)."""
    roles = {}
    for role in style.roles:
        rp = style.prompts[role]
        roles[role] = {"base": dict(rp.base), **({"feedback": dict(rp.feedback)} if rp.feedback else {})}
    return {"format_version": FORMAT_VERSION, "style": style.name, "roles": roles,
            "system_prompt": style.system_prompt, "single_agent": style.single_agent_prompt,
            "final": dict(style.final_instructions), "interface": dict(style.interface_lines)}


def dump_prompt_set(style: StyleSpec, path: str | Path) -> Path:
    """Write a style's prompts as a prompt-set file (.yaml/.yml or .json), e.g. to edit and load back."""
    p, data = Path(path), prompt_set_of(style)
    if p.suffix in (".yaml", ".yml"):
        import yaml  # lazy: optional dependency

        text = yaml.safe_dump(data, sort_keys=False, allow_unicode=False, width=4096)
    else:
        text = json.dumps(data, indent=2, ensure_ascii=True) + "\n"
    p.write_text(text, encoding="utf-8")
    return p


def read_prompt_set(path: str | Path) -> dict:
    """The raw data of a prompt-set file; unreadable or malformed files are one-line ValueErrors."""
    p = Path(path)
    data = read_data_file(p, "--prompt_set")
    if not isinstance(data, dict) or not isinstance(data.get("roles"), dict):
        raise ValueError(f"--prompt_set {str(p)!r}: expected a mapping with a 'roles' mapping "
                         "(role -> variant -> task -> template)")
    return data


def check_prompt_set(data: dict, style: StyleSpec, *, where: str = "prompt set") -> None:
    """Raise ValueError naming role, variant and task for anything that does not fit `style`."""
    unknown = sorted(set(data) - {"format_version", "style", "roles", *OPTIONAL_KEYS})
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; expected roles, {', '.join(OPTIONAL_KEYS)}")
    roles = data["roles"]
    extra, missing = sorted(set(roles) - set(style.roles)), [r for r in style.roles if r not in roles]
    if extra or missing:
        raise ValueError(f"{where}: roles of style {style.name} are {list(style.roles)}; "
                         + (f"missing {missing}" if missing else "") + ("; " if extra and missing else "")
                         + (f"unknown {extra}" if extra else ""))
    for role in style.roles:
        variants = roles[role]
        slots = style.slots.get(role, {})
        needs_feedback = any(e in style.feedback_edges for e in slots.values())
        if not isinstance(variants, dict):
            raise ValueError(f"{where}: role {role}: expected a mapping variant -> task -> template")
        want = set(VARIANTS) if needs_feedback else {"base"}
        if set(variants) != want:
            raise ValueError(f"{where}: role {role}: variants {sorted(variants)}, expected {sorted(want)} "
                             f"(feedback exactly when the role has a feedback slot)")
        for variant, tasks in variants.items():
            expected = sorted(m for m, e in slots.items()
                              if e in style.forward_edges or (variant == "feedback" and e in style.feedback_edges))
            if not isinstance(tasks, dict) or "math" not in tasks:
                raise ValueError(f"{where}: role {role}, variant {variant}: needs a 'math' template "
                                 "(the fallback of other task types)")
            for task, template in tasks.items():
                at = f"{where}: role {role}, variant {variant}, task {task}"
                if task not in TASK_TYPES:
                    raise ValueError(f"{at}: unknown task type; expected one of {TASK_TYPES}")
                if not isinstance(template, str) or "{question}" not in template:
                    raise ValueError(f"{at}: the template must be text containing {{question}}")
                found = _SLOT_RE.findall(template)
                lost = [m for m in expected if m not in found]
                surplus = sorted({m for m in found if m not in expected} | {m for m in found if found.count(m) > 1})
                if lost:
                    raise ValueError(f"{at}: missing slot {', '.join(lost)}")
                if surplus:
                    raise ValueError(f"{at}: unexpected slot {', '.join(surplus)} (expected exactly {expected})")
    for key, allowed in (("final", TASK_TYPES), ("interface", ("functional", "stdin"))):
        table = data.get(key)
        if table is not None and (not isinstance(table, dict) or set(table) - set(allowed)):
            raise ValueError(f"{where}: '{key}' must map some of {allowed} to text")
    iface = data.get("interface") or {}
    if "functional" in iface and "{fn_name}" not in str(iface["functional"]):
        raise ValueError(f"{where}: interface 'functional' line must contain {{fn_name}}")


def apply_prompt_set(style: StyleSpec, data: dict) -> StyleSpec:
    """`style` with its prompts replaced by a checked prompt set."""
    check_prompt_set(data, style)
    prompts = {r: RolePrompts(base=dict(v["base"]), feedback=dict(v.get("feedback") or {}))
               for r, v in data["roles"].items()}
    return dataclasses.replace(
        style, prompts=prompts, system_prompt=data.get("system_prompt", style.system_prompt),
        single_agent_prompt=data.get("single_agent", style.single_agent_prompt),
        final_instructions={**style.final_instructions, **(data.get("final") or {})},
        interface_lines={**style.interface_lines, **(data.get("interface") or {})})


def load_prompt_set(path: str | Path, style: StyleSpec) -> StyleSpec:
    """`style` with the prompts of the file at `path` (checked first; see `check_prompt_set`)."""
    data = read_prompt_set(path)
    check_prompt_set(data, style, where=f"--prompt_set {str(path)!r}")
    return apply_prompt_set(style, data)


def prompt_set_hash(style: StyleSpec) -> str:
    """sha256 (hex) of the style's effective prompts: the same text gives the same hash, whatever file held it."""
    data = prompt_set_of(style)
    data.pop("style")
    data.pop("format_version")
    blob = json.dumps(data, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def prompt_set_hash_for(style_name: str, prompt_set: str | Path | None = None) -> str:
    """The hash a run of `style_name` with `--prompt_set` (None: the built-in prompts) records.

    For resume fingerprints: the same value as results' `prompt_set.sha256`, without planning a system.
    """
    style = get_style(style_name)
    return prompt_set_hash(load_prompt_set(prompt_set, style) if prompt_set else style)


__all__ = ["prompt_set_of", "dump_prompt_set", "read_prompt_set", "check_prompt_set", "apply_prompt_set",
           "load_prompt_set", "prompt_set_hash", "prompt_set_hash_for"]
