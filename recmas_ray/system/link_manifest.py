"""What our checkpoint's manifest says about each link (its kind and constructor arguments), checked against the
registry of link kinds (`links.LINK_KINDS`) and the tensor shapes in the weights file's header, before any weight is
read; and the dimension checks shared with the release layouts (`checkpoints.py`)."""

from __future__ import annotations

from recmas_ray.engine.links import INNER_LINK_TYPE, LINK_KINDS, OUTER_LINK_TYPE, expected_shapes

MANIFEST = "manifest.json"


def check_dims(what: str, got: tuple[int, ...], want: tuple[int, ...]) -> None:
    if got != want:
        raise ValueError(f"{what}: link maps {'->'.join(map(str, got))}, but the models' config.json give "
                         f"{'->'.join(map(str, want))} (hidden sizes)")


def inner_dim(shapes: dict, what: str) -> int:
    w = shapes.get("proj1.weight")
    if w is None or len(w) != 2 or w[0] != w[1]:
        raise ValueError(f"{what}: proj1.weight has shape {w}; an inner link is square (d x d)")
    return int(w[0])


def outer_dims(shapes: dict, what: str) -> tuple[int, int]:
    r, b = shapes.get("residual_proj.weight"), shapes.get("proj2.bias")
    if r is None or b is None or len(r) != 2:
        raise ValueError(f"{what}: residual_proj.weight / proj2.bias missing or malformed")
    return int(r[1]), int(b[0])  # d_s from residual_proj, d_t from proj2.bias as the reference does


def declared_link(manifest: dict, place: str, name: str, shapes: dict, what: str) -> tuple[str, dict]:
    """(kind, constructor arguments) of one link of our checkpoint: from its manifest entry, checked against the
    registry of link kinds; a manifest without entries (older checkpoints) is read as the release's kinds."""
    entry = (manifest.get(place) or {}).get(name) if isinstance(manifest.get(place), dict) else None
    if entry is None:
        kind = INNER_LINK_TYPE if place == "inner" else OUTER_LINK_TYPE
        args = {"hidden_size": inner_dim(shapes, what)} if place == "inner" else dict(
            zip(("in_dim", "out_dim"), outer_dims(shapes, what)))
        return kind, args
    if not isinstance(entry, dict):
        raise TypeError(f"manifest entry of {place} link {name} is a {type(entry).__name__}, expected a mapping")
    kind = entry.get("kind", INNER_LINK_TYPE if place == "inner" else OUTER_LINK_TYPE)
    if kind not in LINK_KINDS or LINK_KINDS[kind] != place:
        known = sorted(k for k, p in LINK_KINDS.items() if p == place)
        raise ValueError(f"{what}: unknown {place} link kind {kind!r} in {MANIFEST}; expected one of {known}")
    args = {k: v for k, v in entry.items() if k != "kind"}
    for key, value in args.items():
        if key != "tau" and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ValueError(f"{what}: {MANIFEST} gives {key}={value!r}; expected a positive integer")
    if kind == "token_link" and not (isinstance(args.get("tau"), (int, float)) and args["tau"] > 0):
        raise ValueError(f"{what}: {MANIFEST} gives tau={args.get('tau')!r}; expected a positive number")
    try:
        want = expected_shapes(kind, args)
    except KeyError as e:
        raise ValueError(f"{what}: {MANIFEST} entry of kind {kind} lacks {e}") from None
    if shapes != want:
        bad = sorted(k for k in set(shapes) | set(want) if shapes.get(k) != want.get(k))
        raise ValueError(f"{what}: tensors {', '.join(f'{k} {shapes.get(k)}' for k in bad[:3])} do not match "
                         f"a link of kind {kind} with {args} (expected {', '.join(f'{k} {want.get(k)}' for k in bad[:3])})")
    return kind, args
