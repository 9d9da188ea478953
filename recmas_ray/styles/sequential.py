"""Sequential style: planner -> critic -> solver, with feedback solver -> planner.

The critic is called "refiner" in the reference code, data and slot names. The planner's feedback
prompt says "This is round 2" in every round >= 2, as the reference does (`fix_round_text` is left
to a future config switch).
"""

import dataclasses

from recmas_ray.models.registry import GEMMA3_270M, SMOLLM2_135M, TINY
from recmas_ray.styles.base import APRIL, JUNE, ReferenceCell, RolePrompts, StyleSpec

PLANNER_SLOT = "<<LATENT_PLANNER_SLOT>>"
REFINED_SLOT = "<<LATENT_REFINED_SLOT>>"
FEEDBACK_SLOT = "<<LATENT_FEEDBACK_SLOT>>"

_CODE_PLAN = "Give a plan of 3 to 6 steps as \"Step 1: ... Step n: ...\". Do not write code."

PLANNER = RolePrompts(
    base={
        "math": "You are the planner agent in a multi-agent system.\nGive a step-by-step plan for solving the "
                "question below. Answer only with the plan, as \"Step 1: ... Step n: ...\".\n\nQuestion: {question}",
        "code": "You are the planner agent in a multi-agent system.\nPlan how to implement the task below. "
                + _CODE_PLAN + "\n\nTask: {question}",
    },
    feedback={
        "math": "You are the planner agent in a recursive multi-agent system. This is round 2.\n\nQuestion: {question}\n\n"
                "Feedback signal from the previous solver round:\n" + FEEDBACK_SLOT + "\n\nUse the feedback as a soft "
                "correction signal, but prioritise the constraints of the question. Output only a concise plan, "
                "\"Step 1: ... Step n: ...\".",
        "code": "You are the planner agent in a recursive multi-agent system. This is round 2.\n\nTask: {question}\n\n"
                "Feedback signal from the previous solver round:\n" + FEEDBACK_SLOT + "\n\nUse the feedback as a soft "
                "correction signal. " + _CODE_PLAN,
    },
)

CRITIC = RolePrompts(base={
    "math": "You are the refiner agent in a multi-agent system.\n\nQuestion: {question}\n\nInitial Plan:\n" + PLANNER_SLOT
            + "\n\nRefine the initial plan: fix mistakes and fill gaps. Answer with the pure refined plan, "
            "\"Step 1: ... Step n: ...\".",
    "code": "You are the refiner agent in a multi-agent system.\n\nTask: {question}\n\nInitial Plan:\n" + PLANNER_SLOT
            + "\n\nRefine the initial plan. " + _CODE_PLAN,
})

SOLVER = RolePrompts(base={
    "math": "You are the solver agent in a multi-agent system.\n\nRefined Plan:\n" + REFINED_SLOT
            + "\n\nQuestion: {question}\n\nSolve the question, using the plan as guidance. {final}",
    "choice": "You are the solver agent in a multi-agent system.\n\nRefined Plan:\n" + REFINED_SLOT
              + "\n\nQuestion: {question}\n\nSolve the question, using the plan as guidance. {final}",
    "code": "You are the solver agent in a multi-agent system.\n\nRefined Plan:\n" + REFINED_SLOT
            + "\n\nTask: {question}\n\nImplement the plan. {final}",
})

SEQUENTIAL = StyleSpec(
    name="sequential",
    stages=(("planner",), ("critic",), ("solver",)),
    forward_edges=("planner->critic", "critic->solver"),
    feedback_edges=("solver->planner",),
    decoder="solver",
    slots={
        "planner": {FEEDBACK_SLOT: "solver->planner"},
        "critic": {PLANNER_SLOT: "planner->critic"},
        "solver": {REFINED_SLOT: "critic->solver"},
    },
    prompts={"planner": PLANNER, "critic": CRITIC, "solver": SOLVER},
    target_fields={"planner": ("plan",), "critic": ("refined_plan",), "solver": ("answer",)},
    fact_tasks=("recall", "two_fact", "compare", "choose"),
    presets={
        # the released RecursiveMAS light system's base models
        "paper": {"planner": "Qwen/Qwen3-1.7B", "critic": "meta-llama/Llama-3.2-1B-Instruct",
                  "solver": "Qwen/Qwen2.5-Math-1.5B-Instruct"},
        "tiny": {"planner": TINY.name("qwen3"), "critic": TINY.name("llama"), "solver": TINY.name("gemma3")},
        "demo": {"planner": SMOLLM2_135M, "critic": GEMMA3_270M, "solver": SMOLLM2_135M},
    },
    reference_cells={
        "math500": ReferenceCell(latent_steps=32, rounds=3, batch_size=32, source=JUNE + "; bs32 from April"),
        "medqa": ReferenceCell(latent_steps=32, rounds=2, batch_size=16, source=JUNE + "; bs16 from April"),
        "gpqa_diamond": ReferenceCell(latent_steps=48, rounds=3, batch_size=16, source=JUNE + "; bs16 from April"),
        "mbppplus": ReferenceCell(latent_steps=16, rounds=3, batch_size=16, source=APRIL),
        "aime2025": ReferenceCell(latent_steps=32, rounds=3, batch_size=15, source=JUNE),
        "aime2026": ReferenceCell(latent_steps=32, rounds=2, source=JUNE),
    },
    reference_max_new_tokens={"math500": 1000},
)
"""The light system (also registered as `sequential` and `sequential_light`)."""

SEQUENTIAL_SCALED = dataclasses.replace(
    SEQUENTIAL,
    presets={**SEQUENTIAL.presets, "paper": {
        "planner": "google/gemma-3-4b-it", "critic": "meta-llama/Llama-3.2-3B-Instruct", "solver": "Qwen/Qwen3.5-4B"}},
    reference_cells={
        "math500": ReferenceCell(latent_steps=64, rounds=2, source=JUNE),
        "medqa": ReferenceCell(latent_steps=48, rounds=3, source=APRIL),
        "gpqa_diamond": ReferenceCell(latent_steps=48, rounds=3, source=APRIL),
        "mbppplus": ReferenceCell(latent_steps=16, rounds=3, source=APRIL),
        "aime2026": ReferenceCell(latent_steps=64, rounds=3, source=JUNE),
        "livecodebench_v6": ReferenceCell(latent_steps=48, rounds=2, temperature=0.2, source=JUNE),
    },
    reference_max_new_tokens={"math500": 2000},
)
"""The scaled system: the same declaration (and name) on larger base models, with its own recommendations."""
