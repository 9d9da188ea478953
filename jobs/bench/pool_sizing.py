"""Per-role pool sizes from measured costs, and the rule that resizes them from measured busy time.

Sizing (`size_pools`): each role's device time per batch comes from the fitted cost table
(jobs/bench/scale_fit.py: measured prefill, latent-step and decoded-token times of the role's model, priced
over the style's schedule by `scale_model.expected_role_ms`); copies are split in proportion
(`role_copies.copies_from_costs`: every role one copy, then each further copy to the role with the worst
cost per copy). `distributed.role_copies.call_cost` (`--auto_role_replicas`) instead prices real models by
parameter count; this module is what the scaling benchmarks use.

Resizing (`resize_pools`, the online rule): over a window, each role's measured demand in copies is
copies x busy (busy: the share of the window its copies were running calls). When the busiest role's busy
is above `high` while another's is below `low`, copies move from the idlest role to the busiest, at most
`max_moves` per decision, each role keeping one, the total unchanged; inside the band nothing moves
(hysteresis: timing noise does not make copies flap). Repeated over windows it converges on the split
`size_pools` would give from the true costs (a test runs it in the model). Busy can come from the agents'
call logs (`call_logs.summarize`: host busy for real agents, device busy for simulated ones).
"""

from __future__ import annotations

from recmas_ray.distributed.role_copies import copies_from_costs


def size_pools(role_ms: dict[str, float], budget: int) -> dict[str, int]:
    """Copies per role for `budget` agents from each role's measured device ms per batch."""
    return copies_from_costs(role_ms, budget=budget)


def resize_pools(copies: dict[str, int], busy: dict[str, float], *, low: float = 0.6, high: float = 0.9,
                 max_moves: int = 1) -> dict[str, int]:
    """One decision of the online rule (module docstring): the new copies per role."""
    if set(copies) != set(busy):
        raise ValueError(f"busy names roles {sorted(busy)}; expected the pools' roles {sorted(copies)}")
    out = dict(copies)
    for _ in range(max_moves):
        hot = max(out, key=lambda r: busy[r] * copies[r] / out[r])  # busy it would have with out[r] copies
        cold = min((r for r in out if out[r] > 1), key=lambda r: busy[r] * copies[r] / out[r], default=None)
        if cold is None or cold == hot:
            break
        hot_busy, cold_busy = (busy[r] * copies[r] / out[r] for r in (hot, cold))
        if hot_busy <= high or cold_busy >= low:
            break
        # move only if the receiving role stays at least as busy as the giver becomes (no overshoot)
        if busy[hot] * copies[hot] / (out[hot] + 1) < busy[cold] * copies[cold] / (out[cold] - 1) * (1 - 1e-6):
            break
        out[hot] += 1
        out[cold] -= 1
    return out
