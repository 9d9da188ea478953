"""Information flow of one evaluated method: the messages on every edge and the answer's NLL by token class.

`FlowRecorder` is the runner's `capture` hook (`runner.run_batch(..., capture=...)`) for one (method, R):
it keeps each question's message per (edge, round) and, where the decoder runs in this process, scores
the gold answer token by token from the very prompt the decoder decoded from (`Agent.target_nll` with
`per_token`, the function behind the rows' NLL; after the run, so its time is not the method's) so the
NLL splits into result / operand / fact / wording tokens (`jobs.experiments.probe.answer_token_classes`). `summary()` turns that into the report's figures: geometry
and held-out probes per edge (`jobs.experiments.probe`), class NLLs per question and on average.
"""

from __future__ import annotations

import threading

from jobs.experiments import probe


class FlowRecorder:
    """Collects what one (method, R) run sent and how its decoder scored the gold answers."""

    def __init__(self, facts: dict[str, dict], decoder_agent=None, *, hidden_facts: tuple[str, ...] = ()):
        self.facts = facts
        """doc id -> the question's facts (`probe.question_facts`)."""
        self.agent = decoder_agent
        self.hidden_facts = hidden_facts
        """Facts only the planner is given (their numbers are "fact" tokens of the answer)."""
        self.messages: dict[tuple[str, int], dict[str, object]] = {}
        self.class_nll: dict[str, dict[str, float | None]] = {}
        self.mean_nll: dict[str, float] = {}
        """doc id -> the mean token NLL of its gold answer (the row's NLL, from the same forward)."""
        self._pending: list[tuple[list[str], list[str], dict]] = []
        self.class_tokens: dict[str, int] = {c: 0 for c in probe.TOKEN_CLASSES}
        self._lock = threading.Lock()

    def hook(self, doc_ids: list[str], targets: list[str]):
        """The `capture` callable of one batch (its questions' ids and gold answers, in batch order)."""

        def capture(event: dict) -> None:
            if event["kind"] == "message":
                msg = event["message"].detach().float().cpu()
                with self._lock:
                    slot = self.messages.setdefault((event["edge"], event["round"]), {})
                    for b, d in enumerate(doc_ids):
                        slot[d] = msg[b]
            elif event["kind"] == "decoder_input" and self.agent is not None:
                with self._lock:  # scored after the run (`score_pending`), outside its timing
                    self._pending.append((doc_ids, targets, event))

        return capture

    def score_pending(self) -> None:
        """Score the decoder inputs captured so far, token by token (in this process)."""
        while True:
            with self._lock:
                if not self._pending:
                    return
                doc_ids, targets, event = self._pending.pop(0)
            self._score(doc_ids, targets, event)

    def _score(self, doc_ids, targets, event) -> None:
        latents = dict(zip(event["slot_names"], event["latents"]))
        token_nll = self.agent.target_nll(event["users"], latents, list(targets), per_token=True)
        for d, target, nll in zip(doc_ids, targets, token_nll):
            hidden = [self.facts[d][k] for k in self.hidden_facts if isinstance(self.facts[d].get(k), float)]
            classes = probe.answer_token_classes(target, self.agent.target_token_offsets(target),
                                                 hidden_values=hidden)
            per = probe.nll_by_class(nll, classes)
            with self._lock:
                self.class_nll[d] = per
                self.mean_nll[d] = sum(nll) / len(nll)
                for c in classes:
                    self.class_tokens[c] += 1

    def summary(self, doc_order: list[str], *, seed: int = 0) -> dict:
        """Per edge and round: geometry and probes of the facts; NLL per token class (mean over questions,
        per question for paired tests) and the token count of each class."""
        import torch  # lazy: demo.py loads this before checking input

        edges = {}
        for (edge, rnd), by_doc in sorted(self.messages.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            docs = [d for d in doc_order if d in by_doc]
            m_NMD = torch.stack([by_doc[d] for d in docs])
            if m_NMD.shape[1] == 0:  # m = 0 (empty slots): no message to measure
                continue
            edges[f"{edge} R{rnd}"] = {
                "edge": edge, "round": rnd, **probe.message_geometry(m_NMD),
                "probe": probe.probe_facts(probe.message_features(m_NMD), [self.facts[d] for d in docs], seed=seed)}
        out = {"edges": edges, "nll_by_class": None, "nll_by_class_per_doc": None, "class_tokens": None}
        if self.class_nll:
            means = {}
            for c in probe.TOKEN_CLASSES:
                vals = [v[c] for v in self.class_nll.values() if v[c] is not None]
                means[c] = sum(vals) / len(vals) if vals else None
            out.update(nll_by_class=means, class_tokens=dict(self.class_tokens),
                       nll_by_class_per_doc={c: {d: self.class_nll[d][c] for d in doc_order if d in self.class_nll}
                                             for c in probe.TOKEN_CLASSES})
        return out
