"""What a collaboration style is: roles, role-pair edges, prompts with latent slots, and the round schedule.

A style is a `StyleSpec` declaration; `build_schedule` turns it into the ordered list of `Step`s that
every consumer walks: the inference runner (local objects or Ray actors), the text baselines and the
outer-loop trainer. Adding a style means writing one new declaration; nothing here changes.

Schedule rule, for round r of R and each role in stage order:
  inputs  = forward edges into the role (produced earlier in the same round)
            + feedback edges into the role when r > 1 (produced in round r - 1)
  outputs = forward edges out of the role + feedback edges out of it when r < R
  decode  = the role is the style's decoder and r == R
A role whose round has feedback inputs uses its "feedback" prompt variant.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from recmas_ray.config.choices import MODEL_PRESETS
from recmas_ray.styles.role_context import question_for_role  # per-role context (hidden-operand rows)
from recmas_ray.tasks import TASK_TYPES, TASKS

VARIANTS = ("base", "feedback")
SYSTEM_PROMPT = "You are a helpful assistant."

FINAL_INSTRUCTIONS = {name: task.instruction for name, task in TASKS.items()}
"""Task family -> its final-answer instruction (`Task.instruction`), the default of every style."""

# The release's code-task interface line (its code variants of the prompts): a function to return,
# or a whole program on stdin/stdout. Rendered after the question by `question_with_interface`.
INTERFACE_LINES = {
    "functional": "Interface: implement and return the function `{fn_name}` only.",
    "stdin": "Interface: write a complete program that reads from standard input and writes to standard output.",
}


JUNE, APRIL = "[Jun] recommendations", "[Apr] recommendations (R from the default 3)"
"""Where a style's `reference_cells` come from (the two public releases, docs/reproducing.md#sources); June's
recommendations override April's for the same cell."""


@dataclass(frozen=True, kw_only=True)
class ReferenceCell:
    """The release's recommendation for one (style, benchmark) pair (`eval.protocol`'s reference protocol)."""

    latent_steps: int
    """m."""
    rounds: int
    """R."""
    batch_size: int | None = None
    """Batch size where the table records one."""
    temperature: float | None = None
    """Per-pair temperature override (else the benchmark's or 0.6)."""
    source: str
    """Where the numbers come from."""


@dataclass(frozen=True)
class RolePrompts:
    """User-prompt templates of one role, keyed by (variant, task type).

    Templates use `{question}` and `{final}` (the task's final-answer instruction) and contain the
    literal slot markers (e.g. `<<LATENT_PLANNER_SLOT>>`) where latent blocks are spliced.
    A missing task type falls back to the "math" template.
    """

    base: dict[str, str]
    feedback: dict[str, str] = field(default_factory=dict)

    def template(self, variant: str, task: str) -> str:
        table = self.feedback if variant == "feedback" else self.base
        if not table:
            raise ValueError(f"no {variant!r} prompt declared for this role")
        return table.get(task, table["math"])


@dataclass(frozen=True)
class StyleSpec:
    """Declaration of a collaboration style. Edges are named `source->target`."""

    name: str
    stages: tuple[tuple[str, ...], ...]
    """Roles in execution order; roles inside one stage may run concurrently."""
    forward_edges: tuple[str, ...]
    """Edges consumed in the same round they are produced."""
    feedback_edges: tuple[str, ...]
    """Edges produced in round r and consumed in round r + 1."""
    decoder: str
    """The role that decodes text in the final round."""
    slots: dict[str, dict[str, str]]
    """role -> {slot marker: incoming edge}."""
    prompts: dict[str, RolePrompts]
    """role -> its prompt templates."""
    target_fields: dict[str, tuple[str, ...]]
    """role -> training-data fields holding its gold output (first present wins)."""
    system_prompt: str = SYSTEM_PROMPT
    """System prompt shared by every role of the style."""
    teacher_text_in_slots: bool = True
    """Inner training fills slots with upstream gold text (False keeps the literal marker, as deliberation does)."""
    single_agent_prompt: str = "{question}\n\n{final}"
    """Prompt of the decoder alone (single-agent baseline)."""
    final_instructions: dict[str, str] = field(default_factory=lambda: dict(FINAL_INSTRUCTIONS))
    """task type -> the text that replaces `{final}`."""
    interface_lines: dict[str, str] = field(default_factory=lambda: dict(INTERFACE_LINES))
    """Code-task interface type (functional, stdin) -> its line; `{fn_name}` names the function."""
    uses_tools: bool = False
    """The decoder's final decode may run the tool loop (Python, search): tool settings apply to this style."""
    decodes_each_round: bool = False
    """The release's decoder also decodes (and discards) text in non-final rounds; the reference protocol
    turns the runner's `decode_every_round` on for such a style."""
    presets: dict[str, dict[str, str]] = field(default_factory=dict)
    """Model preset (`config.choices.MODEL_PRESETS`: paper, tiny, demo) -> role -> base model (a name of any kind
    in `models.registry`); `system.presets.role_models` reads it."""
    experts: tuple[str, ...] = ()
    """Roles that each stand for one domain and feed the decoder side by side (mixture's math, code and science);
    the `mixture` hidden-fact task tells each its own fact."""
    fact_tasks: tuple[str, ...] = ("recall", "compare", "choose")
    """Hidden-fact tasks (`train.synthetic_facts`) that apply to this style: the single-fact ones tell `first_role`
    a fact; `two_fact` (planner and critic) and `mixture` (`experts`) need the roles they tell."""
    reference_cells: dict[str, ReferenceCell] = field(default_factory=dict)
    """Benchmark key -> the releases' recommended m and R (batch size, temperature) for this style, read by the
    reference protocol (`eval.protocol`); other benchmarks take `reference_default`."""
    reference_default: ReferenceCell | None = None
    """m and R of the benchmarks `reference_cells` does not name (None: the runner defaults m=32, R=3)."""
    reference_max_new_tokens: dict[str, int] = field(default_factory=lambda: {"math500": 2000})
    """Benchmark key -> the release's decoding budget where it depends on the style ([Apr] run.py; every other
    benchmark 4000)."""

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(r for stage in self.stages for r in stage)

    @property
    def first_role(self) -> str:
        """The first role of the first stage: the one a single hidden fact is told to."""
        return self.stages[0][0]

    @property
    def num_hops(self) -> int:
        """Links a first-stage message crosses on its way to the decoder (one per later stage)."""
        return len(self.stages) - 1

    @property
    def edges(self) -> tuple[str, ...]:
        return self.forward_edges + self.feedback_edges

    def validate(self) -> None:
        """Check the declaration is internally consistent (programmer error -> ValueError with names)."""
        roles = set(self.roles)
        for edge in self.edges:
            src, dst = split_edge(edge)
            if src not in roles or dst not in roles:
                raise ValueError(f"style {self.name}: edge {edge!r} names a role not in {sorted(roles)}")
        for role, slots in self.slots.items():
            for marker, edge in slots.items():
                if edge not in self.edges or split_edge(edge)[1] != role:
                    raise ValueError(f"style {self.name}: slot {marker} of {role} is fed by {edge!r}, not an edge into {role}")
                variants = ("feedback",) if edge in self.feedback_edges else ("base",)
                for variant in variants:
                    for task in TASK_TYPES:
                        if marker not in self.prompts[role].template(variant, task):
                            raise ValueError(f"style {self.name}: {variant} prompt of {role} ({task}) is missing its slot {marker}")
        if self.decoder not in roles:
            raise ValueError(f"style {self.name}: decoder {self.decoder!r} is not a role")
        for preset, models in self.presets.items():
            if preset not in MODEL_PRESETS or set(models) - roles:
                raise ValueError(f"style {self.name}: preset {preset!r} names {sorted(models)}; expected a preset of "
                                 f"{MODEL_PRESETS} naming roles of {sorted(roles)}")
        if set(self.experts) - roles:
            raise ValueError(f"style {self.name}: experts {list(self.experts)} are not all roles")


@dataclass(frozen=True)
class Step:
    """One agent call in the unrolled schedule."""

    round: int
    """1-based round index."""
    role: str
    variant: str
    """Prompt variant: "base" or "feedback"."""
    inputs: tuple[tuple[str, str], ...]
    """(slot marker, edge) pairs filled from earlier steps."""
    outputs: tuple[str, ...]
    """Edges whose messages this step produces (empty for the final decode)."""
    decode: bool
    """True for the one final text decode."""
    discard_decode: bool = False
    """Also decode text that is thrown away (the reference mixture summarizer does this every round)."""


def split_edge(edge: str) -> tuple[str, str]:
    """`"planner->critic"` -> `("planner", "critic")`."""
    parts = edge.split("->")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"edge {edge!r} is not of the form 'source->target'")
    return parts[0], parts[1]


def build_schedule(style: StyleSpec, num_rounds: int, *, decode_every_round: bool = False) -> list[Step]:
    """Unroll `style` for `num_rounds` rounds (the single definition of every style's schedule)."""
    if num_rounds < 1:
        raise ValueError(f"num_recursive_rounds must be >= 1, got {num_rounds}")
    steps = []
    for r in range(1, num_rounds + 1):
        for role in style.roles:
            slot_items = style.slots.get(role, {}).items()
            fwd_in = tuple((m, e) for m, e in slot_items if e in style.forward_edges)
            fb_in = tuple((m, e) for m, e in slot_items if e in style.feedback_edges) if r > 1 else ()
            outputs = tuple(e for e in style.forward_edges if split_edge(e)[0] == role)
            if r < num_rounds:
                outputs += tuple(e for e in style.feedback_edges if split_edge(e)[0] == role)
            decode = role == style.decoder and r == num_rounds
            if decode:
                outputs = ()
            if not outputs and not decode:
                continue
            steps.append(Step(
                round=r, role=role, variant="feedback" if fb_in else "base", inputs=fwd_in + fb_in,
                outputs=outputs, decode=decode,
                discard_decode=decode_every_round and role == style.decoder and not decode,
            ))
    return steps


def final_instruction(style: StyleSpec, task: str) -> str:
    """The text a prompt's `{final}` becomes: the style's (or its prompt set's) for `task`, else the family's own
    instruction (a family registered after the style was declared); ValueError for an unknown task type."""
    if task not in TASKS:
        raise ValueError(f"unknown task type {task!r}; expected one of {tuple(TASKS)}")
    return style.final_instructions.get(task, TASKS[task].instruction)


def render_prompt(style: StyleSpec, step_role: str, variant: str, task: str, question: str,
                  slot_text: dict[str, str] | None = None) -> str:
    """The user prompt of a role; slot markers stay in place unless `slot_text` gives text for them."""
    text = style.prompts[step_role].template(variant, task)
    question = question_for_role(question, step_role)
    text = text.replace("{final}", final_instruction(style, task)).replace("{question}", question)
    for marker, value in (slot_text or {}).items():
        text = text.replace(marker, value)
    return text


def render_single_agent_prompt(style: StyleSpec, task: str, question: str) -> str:
    """Prompt of the decoder working alone (the single-agent baseline); it sees the decoder's own context."""
    question = question_for_role(question, style.decoder)
    return style.single_agent_prompt.replace("{final}", final_instruction(style, task)).replace("{question}", question)


def question_with_interface(style: StyleSpec, question: str, interface: dict | None) -> str:
    """The question text with its code-task interface line (`{"type": "functional"|"stdin", "fn_name"}`).

    The line goes after the question, so every role whose template shows `{question}` sees it.
    """
    if not interface:
        return question
    kind = interface.get("type")
    if kind not in style.interface_lines:
        raise ValueError(f"interface type {kind!r}; expected one of {sorted(style.interface_lines)}")
    if kind == "functional" and not interface.get("fn_name"):
        raise ValueError("a functional interface needs its fn_name")
    line = style.interface_lines[kind].replace("{fn_name}", str(interface.get("fn_name") or ""))
    return f"{question}\n\n{line}"
