"""Deliberation style: reflector -> toolcaller; feedback toolcaller -> reflector.

Both roles use the tool-use system prompt. The reflector only rolls out latents (no tools run in
latent mode); the toolcaller's final decode may call tools (see `recmas_ray.tools`).
"""

from recmas_ray.models.registry import GEMMA3_270M, SMOLLM2_135M, TINY
from recmas_ray.styles.base import JUNE, ReferenceCell, RolePrompts, StyleSpec

REFLECTOR_SLOT = "<<DELIBERATION_REFLECTOR_SLOT>>"
FEEDBACK_SLOT = "<<DELIBERATION_FEEDBACK_SLOT>>"

TOOL_SYSTEM_PROMPT = (
    "You are a helpful assistant that solves problems step by step. You can use two tools: a Wikipedia search, "
    "written as <search>query</search>, and a Python interpreter, written as <python>code</python>. Each tool "
    "result is returned to you inside <result>...</result>. Put the final answer within \\boxed{}."
)
_REFLECT = ("You are the reflector agent in a deliberation-style multi-agent system. You may use tools.\n\n"
            "Question: {question}")

DELIBERATION = StyleSpec(
    name="deliberation",
    stages=(("reflector",), ("toolcaller",)),
    forward_edges=("reflector->toolcaller",),
    feedback_edges=("toolcaller->reflector",),
    decoder="toolcaller",
    slots={"reflector": {FEEDBACK_SLOT: "toolcaller->reflector"}, "toolcaller": {REFLECTOR_SLOT: "reflector->toolcaller"}},
    prompts={
        "reflector": RolePrompts(
            base={"math": _REFLECT + "\n\nReflect on how to solve it."},
            feedback={"math": _REFLECT + "\n\nToolcaller feedback signal from the previous round:\n" + FEEDBACK_SLOT
                      + "\n\nUse it as soft guidance and reflect on how to solve the question."},
        ),
        "toolcaller": RolePrompts(base={
            "math": "You are the toolcaller agent in a deliberation-style multi-agent system.\n\nReflector signal:\n"
                    + REFLECTOR_SLOT + "\n\nUse the signal as soft guidance. You may use tools.\n---\n"
                    "Question: {question}\n\n{final}",
        }),
    },
    target_fields={"reflector": ("deliberation_reflector", "answer"), "toolcaller": ("deliberation_toolcaller", "answer")},
    system_prompt=TOOL_SYSTEM_PROMPT,
    teacher_text_in_slots=False,
    uses_tools=True,
    presets={
        "paper": {"reflector": "Qwen/Qwen3.5-4B", "toolcaller": "Qwen/Qwen3.5-4B"},
        "tiny": {"reflector": TINY.name("llama"), "toolcaller": TINY.name("llama")},
        "demo": {"reflector": GEMMA3_270M, "toolcaller": SMOLLM2_135M},
    },
    reference_cells={"hotpotqa": ReferenceCell(latent_steps=32, rounds=2, source=JUNE),
                     "bamboogle": ReferenceCell(latent_steps=16, rounds=3, batch_size=8, source=JUNE)},
    # June: "m16 everywhere" (R from the default 3) except the cells above
    reference_default=ReferenceCell(latent_steps=16, rounds=3, source=JUNE + " (m16 everywhere, R default 3)"),
)
