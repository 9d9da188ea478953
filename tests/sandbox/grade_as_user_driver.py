"""Grades one program for a test, as whatever uid started it (tests start it as 65534 with setpriv).

Reads a JSON request on stdin ({"root": repo, "program": ..., plus `grade_program`'s keyword arguments}) and
prints the CodeResult as JSON. Uses only the standard library, so the system interpreter can run it.
"""
import dataclasses
import json
import sys


def main() -> None:
    req = json.load(sys.stdin)
    sys.path.insert(0, req.pop("root"))
    from recmas_ray.tasks.code_graders import grade_program

    res = grade_program(req.pop("program"), **req)
    print(json.dumps(dataclasses.asdict(res)))


if __name__ == "__main__":
    main()
