"""Checks of the two-hop experiment (`two_hop_diag`): does a rollout state the fact value, a perfect hop-1
link's embeddings, the hop-1 ceilings, and a token-classification refinement of a fitted link."""

from __future__ import annotations

import torch


def states_value(agent, h_ND: torch.Tensor, rows: list[dict], m: int) -> str:
    """"hits/N (value: first row's text)": rows whose m argmax tokens of `agent` at h_ND contain the fact value."""
    texts = [agent.tokenizer.decode(ids) for ids in agent.logits(h_ND).argmax(-1).reshape(len(rows), m).tolist()]
    hits = sum(str(r["facts"]["fact"]) in t.replace(" ", "") for r, t in zip(rows, texts))
    return f"{hits}/{len(rows)} ({rows[0]['facts']['fact']}: {texts[0]!r})"


def exact_embeddings(source, target, h_ND: torch.Tensor) -> tuple[torch.Tensor, list[str]]:
    """`target`'s input embedding of the first token of `source`'s argmax text at each h_t (a perfect link's
    output), and those texts."""
    texts = [source.tokenizer.decode([t]) for t in source.logits(h_ND).argmax(-1).tolist()]
    ids = [(target.tokenizer(t, add_special_tokens=False).input_ids or [0])[0] for t in texts]
    emb = target.model.get_input_embeddings()
    return emb(torch.tensor(ids)), texts


def nearest_token_share(v_ND: torch.Tensor, exact_ND: torch.Tensor, embed, m: int) -> list[float]:
    """Per rollout step, the share of rows whose nearest token of `embed` (by cosine) to v is the one nearest to
    the exact embedding (rows of m steps each), rounded to 3 places."""
    unit = torch.nn.functional.normalize(embed.weight.float(), dim=-1)
    want = (torch.nn.functional.normalize(exact_ND.float(), dim=-1) @ unit.T).argmax(-1)
    near = (torch.nn.functional.normalize(v_ND.float(), dim=-1) @ unit.T).argmax(-1)
    return [round(float(r), 3) for r in (near == want).float().reshape(-1, m).mean(0)]


def token_classification_fit(link, x_ND, ids_N, emb, num_steps: int, name: str, temperature: float = 0.05):
    """Refine a ridge-fitted link on its pairs: cross-entropy over the cosines of link(x) to the embeddings of
    every target token the pairs name (the right token must be the nearest, which a least-squares fit to
    embeddings does not ask), plus the regression loss relative to the targets' scale."""
    cands, index_N = torch.unique(ids_N, return_inverse=True)
    with torch.no_grad():
        e_CE = emb(cands).float()
        y_NE = e_CE[index_N]

    def nearest_accuracy():
        """(share whose nearest candidate is right, mean cosine to the right embedding, mean norm ratio)"""
        with torch.no_grad():
            o_NE = link(x_ND)
            out = torch.nn.functional.normalize(o_NE, dim=-1) @ torch.nn.functional.normalize(e_CE, dim=-1).T
            cos = torch.nn.functional.cosine_similarity(o_NE, y_NE, dim=-1).mean()
            ratio = (o_NE.norm(dim=-1) / y_NE.norm(dim=-1)).mean()
            return f"{float((out.argmax(-1) == index_N).float().mean()):.3f} / cos {float(cos):.3f} / norm x{float(ratio):.2f}"

    before = nearest_accuracy()
    link.float().requires_grad_(True)
    opt = torch.optim.AdamW(link.parameters(), lr=1e-3, weight_decay=0.0)
    scale = float(y_NE.pow(2).mean())
    for _ in range(num_steps):
        out_NE = link(x_ND)
        cos_NC = torch.nn.functional.normalize(out_NE, dim=-1) @ torch.nn.functional.normalize(e_CE, dim=-1).T
        loss = torch.nn.functional.cross_entropy(cos_NC / temperature, index_N) + \
            (out_NE - y_NE).pow(2).mean() / scale + \
            (1 - torch.nn.functional.cosine_similarity(out_NE, y_NE, dim=-1)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    link.requires_grad_(False)
    print(f"[2hop] token-classification fit {name}: nearest target token right / cosine to it / norm "
          f"ratio {before} -> {nearest_accuracy()} of {len(ids_N)} states ({len(cands)} tokens, {num_steps} steps)", flush=True)


@torch.no_grad()
def print_ceilings(planner, critic, style, sched, task: str, m: int, rows: list[dict]) -> None:
    """How often the critic's m-step rollout states the value (a) told the fact in text before its question,
    (b) with its slot holding its own embeddings of the planner's rollout argmax tokens: hop 1's upper bounds."""
    from recmas_ray.styles import render_prompt
    from recmas_ray.train.outer import prepare_samples

    ss = prepare_samples(rows, style, task)
    slot = sched[1].inputs[0][0]

    def says(e_BLD, mask_BL):
        return states_value(critic, critic.latent_rollout(e_BLD, mask_BL, m).reshape(-1, critic.hidden_size), rows, m)

    told = [render_prompt(style, "critic", sched[1].variant, task, f"{r['role_context']['planner']} {s.question}")
            for r, s in zip(rows, ss)]
    print(f"[2hop] ceiling: critic told the fact in text, its rollout says the value {says(*critic.embed_batch(told, {slot: torch.zeros(len(rows), 0, critic.hidden_size)}))}",
          flush=True)
    users = [render_prompt(style, "planner", sched[0].variant, task, s.question) for s in ss]
    h_ND = planner.latent_rollout(*planner.embed_batch(users), m).reshape(-1, planner.hidden_size)
    exact, texts = exact_embeddings(planner, critic, h_ND)
    msg = exact.reshape(len(rows), m, -1)
    plain = [render_prompt(style, "critic", sched[1].variant, task, s.question) for s in ss]
    print(f"[2hop] ceiling: slot holds the planner's argmax tokens ({texts[:m]}) as the critic's embeddings, its "
          f"rollout says the value {says(*critic.embed_batch(plain, {slot: msg}))}", flush=True)


@torch.no_grad()
def print_hop2_ceilings(critic, solver, style, sched, task: str, m: int, rows: list[dict], critic_rollout,
                        link2) -> None:
    """Hop 2's upper bounds, on the solver's decoded reply (strict / lenient): its slot holding its own embeddings
    of the critic's rollout argmax tokens (a perfect hop-2 link), and those tokens told in text before its
    question; then how often the nearest solver token of link2(z) is that token, per rollout step."""
    from recmas_ray.config.recursion import DecodeConfig
    from recmas_ray.eval.graders import grade_lenient, grade_math_strict
    from recmas_ray.styles import render_prompt
    from recmas_ray.train.outer import prepare_samples

    ss = prepare_samples(rows, style, task)
    slot = sched[2].inputs[0][0]
    z_ND, h_ND = critic_rollout(ss)
    exact, texts = exact_embeddings(critic, solver, h_ND)
    said = ["".join(texts[i * m:(i + 1) * m]) for i in range(len(rows))]
    cfg = DecodeConfig(max_new_tokens=16, seed=0)

    def graded(e_BLD, mask_BL, name):
        replies = [d.text for d in solver.decode(e_BLD, mask_BL, cfg)]
        strict = sum(bool(grade_math_strict(t, r["gold"])) for t, r in zip(replies, rows))
        lenient = sum(grade_lenient(t, r["gold"]).correct for t, r in zip(replies, rows))
        print(f"[2hop] hop-2 ceiling, {name}: strict {strict}/{len(rows)}, lenient {lenient}/{len(rows)}; e.g. "
              f"{[(r['gold'], s, t) for r, s, t in list(zip(rows, said, replies))[:3]]}", flush=True)

    plain = [render_prompt(style, "solver", sched[2].variant, task, s.question) for s in ss]
    graded(*solver.embed_batch(plain, {slot: exact.reshape(len(rows), m, -1)}),
           "slot holds the critic's argmax tokens as the solver's embeddings")
    told = [render_prompt(style, "solver", sched[2].variant, task, f"{t.strip()} {s.question}")
            for t, s in zip(said, ss)]
    graded(*solver.embed_batch(told, {slot: torch.zeros(len(rows), 0, solver.hidden_size)}),
           "told the critic's argmax text before its question")
    print(f"[2hop] hop-2 link: its nearest solver token is the critic's argmax, per step ({texts[:m]}): "
          f"{nearest_token_share(link2(z_ND), exact, solver.model.get_input_embeddings(), m)}", flush=True)
