"""The value codec between a sandboxed child and its parent: `encode_value` (child side: a candidate's return value
as strict JSON of plain types) and `decode_value` (parent side: the inverse, which refuses anything else).

Like `boot.py` this text also runs inside the child: `sandbox/__init__.py` puts it ahead of `boot.py`'s text in the
one program the child compiles, so it must stay self-contained (standard library only, imported inside functions).
The parent imports it as an ordinary module (`tasks/code_graders.py`).
"""

PROBE_MARK = "RECMAS-PROBE-RESULTS "
_MAX_DEPTH = 400
# collections types encoded as the builtin they compare as against a test's literal (Counter({...}) == {...}).
_DICT_TYPES = {"Counter": dict, "OrderedDict": dict, "defaultdict": dict}


def encode_value(value, _depth=0):
    """A candidate's return value as strict JSON of plain types; TypeError for anything that is not plain data.

    None, bool, str, int (|x| >= 2**63 as ``{"int": hex}``), finite float, and lists (exact types only: no
    subclasses, so an object that compares equal to anything, or a list subclass with its own ``__eq__``, is
    refused) stay themselves; other values become one-key objects: ``{"float": "nan"|"inf"|"-inf"}``,
    ``{"tuple": [...]}``, ``{"set"|"frozenset": [...]}`` (items sorted by their JSON text, so the encoding is
    deterministic), ``{"dict": [[key, value], ...]}`` (insertion order), ``{"complex": [re, im]}``,
    ``{"bytes"|"bytearray": hex}``, ``{"deque": [...]}``, ``{"re.Match": group(0)}`` (decoded to an object that is
    truthy and equal to nothing else, as a match is). Counter, OrderedDict and defaultdict become dicts and a
    namedtuple a tuple, read through the builtin's own accessors; a numpy scalar becomes its ``item()``.
    """
    import json  # lazy: the sandboxed child's boot text (no module-level imports)
    t = type(value)
    if value is None or t is bool or t is str:
        return value
    if t is int:
        return value if -(1 << 63) < value < (1 << 63) else {"int": format(value, "x")}
    if t is float:
        return value if value - value == 0 else {"float": repr(value)}
    if _depth > _MAX_DEPTH:
        raise TypeError("not plain data: nested deeper than %d" % _MAX_DEPTH)
    if t is list:
        return [encode_value(v, _depth + 1) for v in value]
    if t is tuple:
        return {"tuple": [encode_value(v, _depth + 1) for v in value]}
    if t is set or t is frozenset:
        items = [encode_value(v, _depth + 1) for v in value]
        return {t.__name__: sorted(items, key=lambda e: json.dumps(e, sort_keys=True))}
    if t is dict:
        return {"dict": [[encode_value(k, _depth + 1), encode_value(v, _depth + 1)] for k, v in value.items()]}
    if t is complex:
        return {"complex": [encode_value(value.real), encode_value(value.imag)]}
    if t is bytes or t is bytearray:
        return {t.__name__: value.hex()}
    module = getattr(t, "__module__", None)
    if module == "collections" and t.__name__ == "deque":
        return {"deque": [encode_value(v, _depth + 1) for v in value]}
    base = _DICT_TYPES.get(t.__name__) if module == "collections" else None
    if base is None and t.__bases__ == (tuple,) and hasattr(t, "_fields") and t.__eq__ is tuple.__eq__:
        base = tuple  # a namedtuple compares as its items
    if base is not None and isinstance(value, base):  # read through the builtin's own accessors: plain data only
        return encode_value(base(dict.items(value) if base is dict else tuple.__iter__(value)), _depth)
    if t.__name__ == "Match" and module == "re":  # truthy, equal only to itself (`assert re.match(...)`)
        return {"re.Match": encode_value(value.group(0), _depth + 1)}
    if module == "numpy" and callable(getattr(value, "item", None)) and _depth < 2:
        item = value.item()
        if type(item) in (bool, int, float, complex, str, bytes):
            return encode_value(item, _depth + 1)
    raise TypeError("not plain data: a %s" % getattr(t, "__qualname__", "?"))


class _MatchValue:
    """A returned ``re.Match`` on the parent's side: truthy, equal only to itself."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return "<re.Match %r>" % (self.text,)


def decode_value(obj, _depth=0):
    """Inverse of `encode_value` on parsed JSON; ValueError for anything `encode_value` cannot produce."""
    t = type(obj)
    if obj is None or t in (bool, int, str) or (t is float and obj - obj == 0):
        return obj
    if _depth > _MAX_DEPTH:
        raise ValueError("encoded value nested deeper than %d" % _MAX_DEPTH)
    if t is list:
        return [decode_value(v, _depth + 1) for v in obj]
    if t is dict and len(obj) == 1:
        ((tag, v),) = obj.items()
        items = lambda: [decode_value(x, _depth + 1) for x in v]  # noqa: E731
        try:
            if tag == "int" and type(v) is str:
                return int(v, 16)
            if tag == "float" and v in ("nan", "inf", "-inf"):
                return float(v)
            if tag == "tuple" and type(v) is list:
                return tuple(items())
            if tag == "set" and type(v) is list:
                return set(items())
            if tag == "frozenset" and type(v) is list:
                return frozenset(items())
            if tag == "dict" and type(v) is list and all(type(p) is list and len(p) == 2 for p in v):
                return {decode_value(k, _depth + 1): decode_value(x, _depth + 1) for k, x in v}
            if tag == "complex" and type(v) is list and len(v) == 2:
                return complex(*items())
            if tag == "bytes" and type(v) is str:
                return bytes.fromhex(v)
            if tag == "bytearray" and type(v) is str:
                return bytearray.fromhex(v)
            if tag == "deque" and type(v) is list:
                import collections  # lazy: the sandboxed child's boot text (no module-level imports)
                return collections.deque(items())
            if tag == "re.Match" and type(v) is str:
                return _MatchValue(v)
        except TypeError as exc:  # an unhashable set item or dict key
            raise ValueError("malformed encoded %s: %s" % (tag, exc)) from None
    raise ValueError("not an encoded value: %.80r" % (obj,))
