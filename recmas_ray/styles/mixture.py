"""Mixture style: math, code and science experts -> summarizer; feedback summarizer -> each expert.

The three expert blocks go into three separate slots of the summarizer prompt, in a fixed order (no
pooling). The reference summarizer decodes text every round and throws the non-final texts away;
here that is the runner's `decode_every_round` switch, off by default (`decodes_each_round` tells the
reference protocol to turn it on).
"""

from recmas_ray.models.registry import GEMMA3_270M, SMOLLM2_135M, TINY
from recmas_ray.styles.base import JUNE, ReferenceCell, RolePrompts, StyleSpec

EXPERTS = ("math", "code", "science")
EXPERT_SLOTS = {"math": "<<HIE_MATH_EXPERT_SLOT>>", "code": "<<HIE_CODE_EXPERT_SLOT>>",
                "science": "<<HIE_SCIENCE_EXPERT_SLOT>>"}
FEEDBACK_SLOT = "<<HIE_FEEDBACK_SLOT>>"
_CHOICE = "\nChoose the correct option (A/B/C/D)."


def _expert(domain: str) -> RolePrompts:
    head = f"You are the {domain} expert in a multi-agent system.\n\nQuestion: {{question}}"
    fb = ("\n\nFeedback signal from the previous summarizer round:\n" + FEEDBACK_SLOT
          + "\n\nUse the feedback as a soft correction signal and give a concise updated expert answer.")
    return RolePrompts(
        base={"math": head + "\n\nGive your expert analysis.", "choice": head + _CHOICE + "\n\nGive your expert analysis."},
        feedback={"math": head + fb, "choice": head + _CHOICE + fb},
    )


_SUMMARY = ("You are the summarizer agent in a multi-agent system.\n\nMath expert signal:\n" + EXPERT_SLOTS["math"]
            + "\n\nCode expert signal:\n" + EXPERT_SLOTS["code"] + "\n\nScience expert signal:\n"
            + EXPERT_SLOTS["science"] + "\n\nYou may reference the three experts. Reason step by step and solve the "
            "problem below.\n\nQuestion: {question}\n\n{final}")

MIXTURE = StyleSpec(
    name="mixture",
    stages=(EXPERTS, ("summarizer",)),
    forward_edges=tuple(f"{e}->summarizer" for e in EXPERTS),
    feedback_edges=tuple(f"summarizer->{e}" for e in EXPERTS),
    decoder="summarizer",
    slots={**{e: {FEEDBACK_SLOT: f"summarizer->{e}"} for e in EXPERTS},
           "summarizer": {EXPERT_SLOTS[e]: f"{e}->summarizer" for e in EXPERTS}},
    prompts={**{e: _expert(e) for e in EXPERTS}, "summarizer": RolePrompts(base={"math": _SUMMARY})},
    target_fields={
        "math": ("hie_math_expert", "math_expert", "expert_math"),
        "code": ("hie_code_expert", "code_expert", "expert_code"),
        "science": ("hie_science_expert", "science_expert", "expert_science"),
        "summarizer": ("hie_summarizer", "summary", "answer"),
    },
    decodes_each_round=True,
    experts=EXPERTS,
    fact_tasks=("recall", "mixture", "compare", "choose"),  # recall tells the math expert alone
    presets={
        "paper": {"math": "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "code": "Qwen/Qwen2.5-Coder-3B-Instruct",
                  "science": "BioMistral/BioMistral-7B", "summarizer": "Qwen/Qwen3.5-2B"},
        "tiny": {"math": TINY.name("qwen3"), "code": TINY.name("llama"), "science": TINY.name("mistral"),
                 "summarizer": TINY.name("gemma3")},
        "demo": {"math": SMOLLM2_135M, "code": GEMMA3_270M, "science": SMOLLM2_135M, "summarizer": SMOLLM2_135M},
    },
    reference_cells={"livecodebench_v6": ReferenceCell(latent_steps=16, rounds=3, temperature=0.2,
                                                       source=JUNE + " (R not recorded: default 3)")},
)
