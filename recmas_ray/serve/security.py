"""What keeps the endpoint closed by default: Bearer keys by digest, the request-size limit, loopback binds.

No Ray or FastAPI import at module level (the config checks use `key_digest` before anything starts).

- API key: the server holds only `sha256:<hex>` of the key (the config is redacted by construction), and
  compares the digest of what a client sends in constant time. 401 with OpenAI's error body otherwise.
- Request size: `Content-Length` above the limit is refused before the body is read; a body sent without
  one (chunked) is read up to the limit and refused past it (HTTP 413).
- Listeners: Ray Serve 2.60 starts each replica's inter-deployment gRPC server on `[::]:0` (every
  interface, hard-coded in `ray.serve._private.replica`). `bind_replica_grpc_to_node_address` makes it
  bind the replica's Ray node address instead (127.0.0.1 on a private local cluster; the node's own
  cluster address on a multi-node one, which other nodes need).
"""

from __future__ import annotations

import hashlib
import hmac

API_KEY_ENV = "RECMAS_API_KEY"
_DIGEST_PREFIX = "sha256:"


def key_digest(key: str) -> str:
    """`sha256:<hex>` of a key (a digest given as the key is kept as is)."""
    if not isinstance(key, str) or not key.strip():
        raise ValueError("--api_key must be a non-empty string (or unset for no authentication)")
    if key.startswith(_DIGEST_PREFIX) and len(key) == len(_DIGEST_PREFIX) + 64:
        return key
    return _DIGEST_PREFIX + hashlib.sha256(key.encode()).hexdigest()


def authorized(authorization: str | None, digest: str | None) -> bool:
    """Whether an `Authorization` header carries the key of `digest` (always true without a key)."""
    if digest is None:
        return True
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return False
    presented = _DIGEST_PREFIX + hashlib.sha256(token.strip().encode()).hexdigest()
    return hmac.compare_digest(presented.encode(), digest.encode())


def unauthorized_body() -> dict:
    """OpenAI's 401 body."""
    return {"error": {"message": "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
                      "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}


def too_large_body(limit: int) -> dict:
    """OpenAI-style 413 body naming the limit."""
    return {"error": {"message": f"the request body is larger than this server's limit of {limit} bytes "
                                 f"(--max_request_bytes)", "type": "invalid_request_error", "param": None,
                      "code": "request_too_large"}}


class BodyTooLarge(Exception):
    """A request body over the limit (answered 413)."""


async def read_body(request, limit: int) -> bytes:
    """The body of a Starlette request, refusing more than `limit` bytes before reading them."""
    length = request.headers.get("content-length")
    if length is not None and length.strip().isdigit() and int(length) > limit:
        raise BodyTooLarge()
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


def bind_replica_grpc_to_node_address() -> str:
    """Inside a Serve replica, before Serve starts its gRPC server: bind it to the node address, not `[::]`."""
    import ray  # lazy: ray must not load with --help or before a job's first line
    # lazy: ray must not load with --help or before a job's first line
    import ray.serve._private.replica as replica_module

    host = ray._private.worker.global_worker.node_ip_address or "127.0.0.1"
    original = getattr(replica_module.add_port_to_grpc_server, "__wrapped__", replica_module.add_port_to_grpc_server)

    def bind_node_address(server, address: str):
        if address.startswith("[::]:") or address.startswith("0.0.0.0:"):
            address = f"{f'[{host}]' if ':' in host else host}:{address.rsplit(':', 1)[1]}"
        return original(server, address)

    bind_node_address.__wrapped__ = original
    replica_module.add_port_to_grpc_server = bind_node_address
    return host
