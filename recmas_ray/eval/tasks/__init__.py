"""Benchmarks as tasks, one module per family: its loaders (published rows -> normalised items), prompt fields
and grader. `recmas_ray.eval.benchmarks` names the benchmarks and dispatches to these `LOADERS`.

  math             MATH-500, AIME 2025 / 2026, GSM8K        grade_math_strict / grade_math_reference
  multiple_choice  GPQA-Diamond, MedQA                      extract_choice
  qa               HotpotQA, Bamboogle                      exact_match, f1_score
  code             MBPP+, LiveCodeBench v6, HumanEval       eval/code_graders.grade_code (sandboxed)

`recmas_ray.eval.graders.grade(task_type, ...)` dispatches to these graders (and re-exports them).
"""
