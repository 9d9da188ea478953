"""The engine floor's core (plain torch, no Ray): the links, the agent (a frozen model with its links), its KV
cache, step scheduler, decoding and scoring, the recursion runner over an agent pool, the text rows over the same
senders, the in-process pool and the call surface of one agent.

Importing the package imports none of its modules (no torch): import the module you need
(`recmas_ray.engine.links`, `recmas_ray.engine.agent`, ...).
"""
