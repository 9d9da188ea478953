"""Runs one sandbox call for a test, as whatever uid started it (tests start it as 65534 with setpriv).

Reads a JSON request on stdin ({"root": repo, "code": ..., "stdin": ..., "tests": ..., "config": {...}}) and
prints the SandboxResult as JSON. Uses only the standard library, so the system interpreter can run it.
"""
import dataclasses
import json
import sys


def main() -> None:
    req = json.load(sys.stdin)
    sys.path.insert(0, req["root"])
    from recmas_ray.sandbox import SandboxConfig, run_python

    res = run_python(req["code"], config=SandboxConfig(**req["config"]), stdin=req["stdin"], tests=req["tests"])
    print(json.dumps(dataclasses.asdict(res)))


if __name__ == "__main__":
    main()
