"""LiveCodeBench private tests are decoded without running pickled code."""
import base64
import json
import os
import pickle
import zlib

import pytest

from recmas_ray.tasks import code as B


def _blob(obj, protocol=pickle.DEFAULT_PROTOCOL) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(obj, protocol=protocol))).decode()


ROWS = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_published_format_decodes(protocol):
    assert B._decode_private(_blob(json.dumps(ROWS), protocol)) == ROWS
    assert B._decode_private(json.dumps(ROWS)) == ROWS  # plain JSON rows


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Evals:
    def __reduce__(self):
        return (eval, ("__import__('os').getpid()",))


@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_malicious_pickle_does_not_run(tmp_path, protocol):
    marker = tmp_path / "pwned"
    for payload in (_RunsCode(marker), [json.dumps(ROWS), _RunsCode(marker)], _Evals(), {"x": _Evals()}):
        with pytest.raises(pickle.UnpicklingError, match="only primitive values"):
            B._decode_private(_blob(payload, protocol))
    assert not marker.exists()


def test_decompression_bomb_is_refused(monkeypatch):
    monkeypatch.setattr(B, "_MAX_PRIVATE_BYTES", 1000)
    with pytest.raises(ValueError, match="larger than 1000 bytes"):
        B._decode_private(_blob("x" * 100000))
