"""The closed-by-default parts (no server started): API key digests and Bearer checks, redaction of the key
in configs, the streamed body limit, and `init_ray`, which starts a private cluster unless given an address
(a planted /tmp/ray/ray_current_cluster is never read) and makes Ray's token file owner-only."""

import asyncio
import json
import os

import pytest

from recmas_ray.serve.security import (API_KEY_ENV, BodyTooLarge, authorized, key_digest, read_body,
                                       unauthorized_body)


def test_bearer_checks_against_the_digest():
    digest = key_digest("s3cret-key")
    assert digest.startswith("sha256:") and "s3cret" not in digest and key_digest(digest) == digest
    assert authorized("Bearer s3cret-key", digest) and authorized("bearer  s3cret-key ", digest)
    for header in (None, "", "Bearer", "Bearer wrong", "Basic s3cret-key", "s3cret-key"):
        assert not authorized(header, digest), header
    assert authorized(None, None)  # no key configured: open
    assert unauthorized_body()["error"]["code"] == "invalid_api_key"
    with pytest.raises(ValueError, match="--api_key"):
        key_digest("  ")


def test_the_key_is_never_in_the_config_nor_printed(monkeypatch, capsys):
    from jobs import serve as serve_job

    cfg = serve_job.parse(["--style", "mixture", "--api_key", "flag-key-123"])
    assert cfg.api_key == key_digest("flag-key-123") and "flag-key-123" not in repr(cfg)
    monkeypatch.setenv(API_KEY_ENV, "env-key-456")
    cfg = serve_job.parse(["--style", "mixture"])
    assert cfg.api_key == key_digest("env-key-456")
    assert serve_job.main(["--style", "mixture", "--print_config"]) == 0
    printed = capsys.readouterr().out
    assert "env-key-456" not in printed and json.loads(printed)["api_key"] == key_digest("env-key-456")
    monkeypatch.delenv(API_KEY_ENV)
    assert serve_job.parse(["--style", "mixture"]).api_key is None
    cfg = serve_job.parse(["--style", "mixture"])
    assert (cfg.host, cfg.max_request_bytes, cfg.address) == ("127.0.0.1", 4 << 20, None)


class _Request:
    def __init__(self, chunks, length=None):
        self.headers = {} if length is None else {"content-length": str(length)}
        self._chunks = chunks

    async def stream(self):
        for c in self._chunks:
            yield c


def test_body_limit_refuses_by_length_and_while_streaming():
    assert asyncio.run(read_body(_Request([b"ab", b"cd"], 4), 4)) == b"abcd"
    read = []

    class Counting(_Request):
        async def stream(self):
            for c in self._chunks:
                read.append(c)
                yield c

    with pytest.raises(BodyTooLarge):  # declared too large: nothing is read
        asyncio.run(read_body(Counting([b"x" * 10], 10), 4))
    assert read == []
    with pytest.raises(BodyTooLarge):  # chunked without a length: stops at the limit
        asyncio.run(read_body(Counting([b"xxx"] * 100), 7))
    assert len(read) == 3


@pytest.fixture
def fake_ray_init(monkeypatch):
    import ray
    from ray._private import ray_constants

    seen = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.append(dict(kw, cluster=ray_constants.ENABLE_RAY_CLUSTER)))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    return seen


def test_init_ray_never_joins_a_planted_cluster(fake_ray_init, monkeypatch):
    from recmas_ray.distributed import cluster

    # Whatever Ray's address file says (anyone can write /tmp/ray), it is not consulted.
    monkeypatch.setattr("ray._private.utils.read_ray_address", lambda *a, **k: "10.9.9.9:6379")
    cluster.init_ray(num_cpus=1)
    assert fake_ray_init[-1]["address"] == "local" and fake_ray_init[-1]["_node_ip_address"] == "127.0.0.1"
    assert fake_ray_init[-1]["cluster"] is False
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6390")  # Ray's convention (ray job submit sets it)
    cluster.init_ray()
    assert fake_ray_init[-1]["address"] == "127.0.0.1:6390"
    cluster.init_ray("127.0.0.1:6391")
    assert fake_ray_init[-1]["address"] == "127.0.0.1:6391"


def test_init_local_ray_makes_the_token_owner_only(fake_ray_init, monkeypatch, tmp_path):
    from recmas_ray.distributed import cluster

    monkeypatch.setenv("HOME", str(tmp_path))
    token = tmp_path / ".ray" / "auth_token"
    token.parent.mkdir()
    token.write_text("t" * 32)
    token.chmod(0o644)
    cluster.init_local_ray(num_cpus=1)
    assert token.stat().st_mode & 0o777 == 0o600
    fresh = tmp_path / "other"
    monkeypatch.setenv("HOME", str(fresh))
    fresh.mkdir()
    cluster.init_local_ray(num_cpus=1)
    assert (fresh / ".ray").stat().st_mode & 0o777 == 0o700


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])
