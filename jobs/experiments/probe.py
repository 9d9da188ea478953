"""Information-flow measurement of latent messages: geometry between questions, held-out linear probes of the
question's facts, and the gold answer's NLL split by token class.

  geometry      mean pairwise cosine between questions of one edge's messages (each flattened [M*E]), the
                between-question variance over the mean square (near 0: every question gets nearly one
                vector, a soft prompt), and the mean norm of one latent vector (the scale the target sees)
  probe         cross-validated ridge regression (numeric facts: operands, answer; R^2) and ridge
                classification (categorical facts: operation; accuracy) from message features, against a
                constant baseline fitted on the same training folds (train-fold mean / majority class);
                figures are on held-out folds only, the ridge penalty is chosen inside each training fold
                (exact leave-one-out), features centred on the training fold
  token classes the gold answer's tokens labelled result (numbers after the first '='), operand (numbers
                before it; "fact" where the number is a hidden fact), wording (everything else), so a
                constant soft prompt that only wins the fixed wording shows up as such

Numpy only (the feature counts are small: questions x 2E); the same code serves the demo's report and the
tests.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

_ARITH_RE = re.compile(r"What is (\d+) ([+\-*]) (\d+)\?")
_NUM_RE = re.compile(r"\d+")
TOKEN_CLASSES = ("result", "operand", "fact", "wording")


# ----------------------------------------------------------------------------- facts of a question
def question_facts(row: dict) -> dict[str, float | str]:
    """The facts a message could carry: `row["facts"]` when the generator gives them (name -> number or
    label, e.g. the hidden-operand task), else parsed from an arithmetic question "What is a op b?", plus
    the answer (`gold`). Questions of other shapes give the answer only."""
    facts: dict[str, float | str] = {}
    if isinstance(row.get("facts"), dict):
        facts.update({k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v))
                      for k, v in row["facts"].items()})
    else:
        m = _ARITH_RE.search(str(row.get("question", "")))
        if m:
            facts.update(operation=m.group(2), operand_a=float(m.group(1)), operand_b=float(m.group(3)))
    if "answer" not in facts and str(row.get("gold", "")).lstrip("-").isdigit():
        facts["answer"] = float(row["gold"])
    return facts


# ----------------------------------------------------------------------------- geometry
def _flat(messages_NMD) -> np.ndarray:
    x = np.asarray(messages_NMD.float().numpy() if hasattr(messages_NMD, "numpy") else messages_NMD,
                   dtype=np.float64)
    if x.ndim != 3:
        raise ValueError(f"messages must be [N, M, E], got shape {x.shape}")
    return x.reshape(x.shape[0], -1)


def message_geometry(messages_NMD) -> dict:
    """Between-question cosine, variance ratio and scale of one edge's messages [N, M, E]."""
    x = _flat(messages_NMD)
    n = x.shape[0]
    nan = float("nan")
    if n < 2 or x.shape[1] == 0:
        return {"n": n, "mean_cosine": nan, "variance_ratio": nan, "mean_vector_norm": nan}
    unit = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    cos = unit @ unit.T
    mean_cos = float((cos.sum() - np.trace(cos)) / (n * (n - 1)))
    between = float(x.var(axis=0).sum())
    mean_square = float((x ** 2).sum(axis=1).mean())
    e = np.asarray(messages_NMD.float().numpy() if hasattr(messages_NMD, "numpy") else messages_NMD)
    return {"n": n, "mean_cosine": mean_cos, "variance_ratio": between / mean_square if mean_square else nan,
            "mean_vector_norm": float(np.linalg.norm(e, axis=-1).mean())}


def message_features(messages_NMD) -> np.ndarray:
    """Probe features of each question's message: the mean over its M latent vectors and the last one [N, 2E]."""
    x = np.asarray(messages_NMD.float().numpy() if hasattr(messages_NMD, "numpy") else messages_NMD,
                   dtype=np.float64)
    if x.shape[1] == 0:
        return np.zeros((x.shape[0], 0))
    return np.concatenate([x.mean(axis=1), x[:, -1]], axis=1)


# ----------------------------------------------------------------------------- probes
def _folds(n: int, num_folds: int, seed: int) -> list[np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    return [order[k::num_folds] for k in range(num_folds)]


def _ridge_fit_predict(x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray) -> np.ndarray:
    """Ridge in dual form (features >> questions), penalty chosen by exact leave-one-out on the training rows."""
    # centred on the training rows, one global scale: per-feature standardising would blow up directions
    # where the training rows barely vary (a collapsed message), and a held-out row then lands far outside
    mu = x_tr.mean(0)
    scale = float(np.sqrt(((x_tr - mu) ** 2).sum(1).mean())) or 1.0
    a, b = (x_tr - mu) / scale, (x_te - mu) / scale
    y_mean = y_tr.mean(0)
    yc = y_tr - y_mean
    s, u = np.linalg.eigh(a @ a.T)
    s = np.clip(s, 0.0, None)
    uty = u.T @ yc
    best, best_err = None, math.inf
    eig_scale = max(float(s.mean()), 1e-12)
    for c in np.logspace(-4, 4, 17):
        alpha = c * eig_scale
        shrink = s / (s + alpha)
        fit = u @ (shrink[:, None] * uty)
        h_diag = (u ** 2) @ shrink + 1.0 / len(yc)  # + the intercept's (the training mean's) leverage
        err = float((((yc - fit) / np.maximum(1 - h_diag, 1e-9)[:, None]) ** 2).mean())
        if err < best_err:
            best, best_err = alpha, err
    dual = u @ (uty / (s + best)[:, None])
    return (b @ a.T) @ dual + y_mean


def held_out_predictions(features: np.ndarray, y: Sequence[float], *, num_folds: int = 5,
                         seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(ridge probe, train-fold mean) prediction of every row from the folds that hold it out."""
    y_arr = np.asarray(y, dtype=np.float64)
    n = len(y_arr)
    pred, const = np.empty(n), np.empty(n)
    for te in _folds(n, num_folds, seed):
        tr = np.setdiff1d(np.arange(n), te)
        pred[te] = _ridge_fit_predict(features[tr], y_arr[tr, None], features[te])[:, 0]
        const[te] = y_arr[tr].mean()
    return pred, const


def probe_numeric(features: np.ndarray, y: Sequence[float], *, num_folds: int = 5, seed: int = 0) -> dict:
    """Held-out R^2 of a ridge probe and of the constant (train-fold mean) baseline, pooled over folds."""
    y_arr = np.asarray(y, dtype=np.float64)
    n = len(y_arr)
    pred, const = held_out_predictions(features, y_arr, num_folds=num_folds, seed=seed)
    sst = float(((y_arr - y_arr.mean()) ** 2).sum())
    nan = float("nan")
    return {"kind": "r2", "n": n, "score": 1 - float(((y_arr - pred) ** 2).sum()) / sst if sst else nan,
            "baseline": 1 - float(((y_arr - const) ** 2).sum()) / sst if sst else nan}


def probe_categorical(features: np.ndarray, labels: Sequence[str], *, num_folds: int = 5, seed: int = 0) -> dict:
    """Held-out accuracy of a ridge classifier (one-hot targets, argmax) and of the train-fold majority class."""
    classes = sorted(set(labels))
    y = np.array([classes.index(v) for v in labels])
    n = len(y)
    onehot = np.eye(len(classes))[y]
    pred, const = np.empty(n, dtype=int), np.empty(n, dtype=int)
    for te in _folds(n, num_folds, seed):
        tr = np.setdiff1d(np.arange(n), te)
        pred[te] = _ridge_fit_predict(features[tr], onehot[tr], features[te]).argmax(1)
        const[te] = np.bincount(y[tr], minlength=len(classes)).argmax()
    return {"kind": "accuracy", "n": n, "score": float((pred == y).mean()), "baseline": float((const == y).mean())}


def probe_facts(features: np.ndarray, facts: Sequence[dict], *, num_folds: int = 5, seed: int = 0) -> dict:
    """One held-out probe per fact present in every question and not constant over them (name -> result)."""
    n = len(facts)
    if n != features.shape[0]:
        raise ValueError(f"probe_facts: {features.shape[0]} feature rows for {n} questions")
    folds = min(num_folds, n)
    out = {}
    names = [k for k in (facts[0] if facts else {}) if all(k in f for f in facts)]
    for name in names:
        values = [f[name] for f in facts]
        if len(set(values)) < 2 or n < 4 or features.shape[1] == 0:
            continue
        if all(isinstance(v, float) for v in values):
            out[name] = probe_numeric(features, values, num_folds=folds, seed=seed)
        else:
            out[name] = probe_categorical(features, [str(v) for v in values], num_folds=folds, seed=seed)
    return out


# ----------------------------------------------------------------------------- token classes of the answer
def answer_token_classes(target: str, offsets: Sequence[tuple[int, int]], *,
                         hidden_values: Sequence[float] = ()) -> list[str]:
    """Class of each target token from its character span: result (a number after the first '='), fact
    (a number before it whose value is among `hidden_values`), operand (other numbers before it), wording."""
    eq = target.find("=")
    spans = []
    for m in _NUM_RE.finditer(target):
        if eq >= 0:
            kind = "result" if m.start() > eq else "operand"
        else:
            kind = "operand"
        if kind == "operand" and float(m.group()) in set(map(float, hidden_values)):
            kind = "fact"
        spans.append((m.start(), m.end(), kind))
    classes = []
    for start, end in offsets:
        kind = "wording"
        for s, e, k in spans:
            if start < e and s < end:
                kind = k
                break
        classes.append(kind)
    return classes


def nll_by_class(token_nll: Sequence[float], classes: Sequence[str]) -> dict[str, float | None]:
    """Mean NLL of one answer's tokens per class (None where the answer has no token of that class)."""
    if len(token_nll) != len(classes):
        raise ValueError(f"nll_by_class: {len(token_nll)} token NLLs for {len(classes)} token classes")
    out: dict[str, float | None] = {}
    for c in TOKEN_CLASSES:
        vals = [float(v) for v, k in zip(token_nll, classes) if k == c]
        out[c] = sum(vals) / len(vals) if vals else None
    return out


__all__ = ["question_facts", "message_geometry", "message_features", "probe_numeric", "probe_categorical",
           "probe_facts", "answer_token_classes", "nll_by_class", "TOKEN_CLASSES"]
