"""Distillation style: expert -> learner; feedback learner -> expert.

The large expert still runs at inference; "distillation" happens only through the trained links.
"""

from recmas_ray.models.registry import GEMMA3_270M, SMOLLM2_135M, TINY
from recmas_ray.styles.base import JUNE, ReferenceCell, RolePrompts, StyleSpec

EXPERT_SLOT = "<<DISTILL_EXPERT_SLOT>>"
FEEDBACK_SLOT = "<<DISTILL_FEEDBACK_SLOT>>"

_EXPERT_HEAD = ("You are the expert agent in a multi-agent system. Give a concise, execution-ready plan for the "
                "learner agent. Do not give the final answer. Answer as \"Step 1: ... Step n: ...\".\n\nQuestion: {question}")

DISTILLATION = StyleSpec(
    name="distillation",
    stages=(("expert",), ("learner",)),
    forward_edges=("expert->learner",),
    feedback_edges=("learner->expert",),
    decoder="learner",
    slots={"expert": {FEEDBACK_SLOT: "learner->expert"}, "learner": {EXPERT_SLOT: "expert->learner"}},
    prompts={
        "expert": RolePrompts(
            base={"math": _EXPERT_HEAD},
            feedback={"math": _EXPERT_HEAD + "\n\nFeedback signal from the previous round:\n" + FEEDBACK_SLOT
                      + "\n\nUse the feedback as a soft correction signal."},
        ),
        "learner": RolePrompts(base={
            "math": "You are the learner executor in a multi-agent system.\n\nExpert plan:\n" + EXPERT_SLOT
                    + "\n\nUse the expert plan as guidance, but prioritise the constraints of the task.\n---\n"
                    "Question: {question}\n\n{final}",
        }),
    },
    target_fields={"expert": ("distill_expert", "refined_plan", "expert_plan"),
                   "learner": ("distill_learner", "answer", "learner_answer")},
    presets={
        "paper": {"expert": "Qwen/Qwen3.5-9B", "learner": "Qwen/Qwen3.5-4B"},
        "tiny": {"expert": TINY.name("mistral"), "learner": TINY.name("qwen3")},
        "demo": {"expert": GEMMA3_270M, "learner": SMOLLM2_135M},
    },
    reference_cells={
        "math500": ReferenceCell(latent_steps=64, rounds=3, source=JUNE),
        "medqa": ReferenceCell(latent_steps=64, rounds=2, source=JUNE),
        "gpqa_diamond": ReferenceCell(latent_steps=64, rounds=3, source=JUNE),
        "livecodebench_v6": ReferenceCell(latent_steps=64, rounds=2, temperature=0.6, source=JUNE),
        "aime2025": ReferenceCell(latent_steps=32, rounds=3, source=JUNE),
        "aime2026": ReferenceCell(latent_steps=32, rounds=3, source=JUNE),
        "mbppplus": ReferenceCell(latent_steps=16, rounds=2, source=JUNE),
    },
)
