"""Benchmarks as tasks, one module per family: its loaders (published rows -> normalised items), prompt fields
and grader. `recmas_ray.eval.benchmarks` names the benchmarks and dispatches to these `LOADERS`.

  math             MATH-500, AIME 2025 / 2026, GSM8K        graders.grade_math_strict / _reference
  multiple_choice  GPQA-Diamond, MedQA                      graders.extract_choice
  qa               HotpotQA, Bamboogle                      graders.exact_match, f1_score
  code             MBPP+, LiveCodeBench v6, HumanEval       graders.grade_code (sandboxed)
"""
