"""A toy style, added in this one file (docs/architecture.md, "Adding a style"): draft and review, a two-agent
loop whose FIRST agent decodes. The drafter's latent draft goes to the reviewer; the reviewer's latent review
comes back to the drafter as feedback in the next round; in the last round the drafter writes the answer. (The
package's styles all decode in a later stage than the one they start in.)

    round r < R:  drafter --draft--> reviewer --review (feedback)--> drafter of round r + 1
    round R:      drafter decodes
"""

from __future__ import annotations

from recmas_ray.models.registry import TINY
from recmas_ray.styles import StyleSpec, register_style
from recmas_ray.styles.base import RolePrompts

DRAFT_SLOT = "<<LATENT_DRAFT_SLOT>>"
REVIEW_SLOT = "<<LATENT_REVIEW_SLOT>>"

DRAFT_REVIEW = register_style(StyleSpec(
    name="draft_review",
    stages=(("drafter",), ("reviewer",)),
    forward_edges=("drafter->reviewer",),
    feedback_edges=("reviewer->drafter",),
    decoder="drafter",
    slots={"drafter": {REVIEW_SLOT: "reviewer->drafter"}, "reviewer": {DRAFT_SLOT: "drafter->reviewer"}},
    prompts={
        "drafter": RolePrompts(
            base={"math": "You draft answers.\n\nQuestion: {question}\n\nWrite a first draft. {final}"},
            feedback={"math": "You draft answers.\n\nQuestion: {question}\n\nA reviewer read your draft:\n"
                              + REVIEW_SLOT + "\n\nWrite the final answer. {final}"}),
        "reviewer": RolePrompts(base={"math": "You review drafts.\n\nQuestion: {question}\n\nDraft:\n" + DRAFT_SLOT
                                              + "\n\nPoint out mistakes in the draft."}),
    },
    target_fields={"drafter": ("answer",), "reviewer": ("review",)},
    fact_tasks=(),  # no hidden-fact training data for the toy
    presets={"tiny": {"drafter": TINY.name("qwen3"), "reviewer": TINY.name("llama")}},
))
