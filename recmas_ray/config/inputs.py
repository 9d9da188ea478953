"""Checks of what a user hands a job or the Python API, run before any side effect.

`checks.py` states per-field rules (ranges, choices); this module holds the rules about the world
those values point at, shared by every job, `train_api.py` and `api.py`:

* paths: existence and kind (regular file vs directory vs FIFO), readable, non-empty, bounded size
  (`check_file`, `check_dir`, `read_text_file`: a decoding error names the file);
* YAML without anchors or aliases (`load_yaml`): a few hundred bytes of nested aliases expand to
  gigabytes once any code walks the data, so they are refused at parse time;
* questions: a string of bounded length (`check_question`);
* the search keys file's mode (`check_keys_file`), device / GPU availability (`check_cuda`);
* `OutputLock`: one run at a time per output folder (`fcntl.flock`, the other run's PID in the error).

Errors are `ConfigError` (a `ValueError`) naming the setting, the value and the fix. Nothing here
creates a file, except `OutputLock`, which is taken only after the whole input was accepted.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
from pathlib import Path

from recmas_ray.config.checks import ConfigError, ConfigTypeError

MAX_QUESTION_CHARS = 100_000
"""Longest question accepted (characters). The longest in the shipped benchmarks (LiveCodeBench) is ~12k;
a longer text is a mistake (a whole file pasted as one row), and a 10 MB one allocates gigabytes of
attention before failing."""
MAX_SETTINGS_FILE_BYTES = 16 << 20
"""Largest --config / prompt-set / keys / checkpoint-config file read into memory."""


def path_problem(path: str | os.PathLike, *, kind: str = "file", readable: bool = True,
                 non_empty: bool = False, max_bytes: int | None = None, private: bool = False) -> str | None:
    """Why `path` is not a usable `kind` ("file" or "dir"), or None. Follows symlinks; creates nothing.
    `private`: group and others may not read it (a file of secrets)."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except FileNotFoundError:
        return "does not exist"
    except NotADirectoryError:
        return "does not exist (a parent is not a directory)"
    except OSError as e:
        return f"cannot be inspected ({e.strerror or e})"
    mode = st.st_mode
    if kind == "file":
        if stat.S_ISDIR(mode):
            return "is a directory; expected a file"
        if stat.S_ISFIFO(mode):
            return "is a FIFO (named pipe); expected a regular file"
        if not stat.S_ISREG(mode):
            return "is not a regular file (a device or socket)"
    elif not stat.S_ISDIR(mode):
        return "is a FIFO (named pipe); expected a directory" if stat.S_ISFIFO(mode) else \
            "is a file; expected a directory"
    if readable and not os.access(p, os.R_OK | (os.X_OK if kind == "dir" else 0)):
        return "is not readable (permission denied)"
    if kind == "file" and non_empty and st.st_size == 0:
        return "is empty"
    if kind == "file" and max_bytes is not None and st.st_size > max_bytes:
        return f"is {st.st_size} bytes; expected at most {max_bytes}"
    if private and stat.S_IMODE(mode) & 0o077:
        return f"is readable by group or others (mode {stat.S_IMODE(mode):04o}): run `chmod 600 {p}`"
    return None


def check_file(flag: str, path, **kw) -> Path:
    """`path` as a readable regular file (see `path_problem` for `kw`), else a ConfigError naming `flag`."""
    problem = path_problem(path, kind="file", **kw)
    if problem:
        raise ConfigError(f"{flag} {str(path)!r} {problem}")
    return Path(path).expanduser()


def check_dir(flag: str, path) -> Path:
    """`path` as a readable directory, else a ConfigError naming `flag`."""
    problem = path_problem(path, kind="dir")
    if problem:
        raise ConfigError(f"{flag} {str(path)!r} {problem}")
    return Path(path).expanduser()


def check_data_path(flag: str, path) -> Path:
    """A data file or a directory of data files: either kind, readable; a file must be non-empty."""
    p = Path(path).expanduser()
    kind = "dir" if p.is_dir() else "file"
    problem = path_problem(p, kind=kind, non_empty=True)
    if problem:
        raise ConfigError(f"{flag} {str(path)!r} {problem}")
    return p


def read_text_file(flag: str, path, *, max_bytes: int = MAX_SETTINGS_FILE_BYTES) -> str:
    """The UTF-8 text of a small settings file; every failure is one ConfigError naming `flag` and the file.

    Opened with O_NONBLOCK after a kind check, so a FIFO swapped in meanwhile cannot block the reader.
    """
    p = check_file(flag, path, max_bytes=max_bytes)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ConfigError(f"{flag} {str(path)!r} is not a regular file")
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise ConfigError(f"{flag} {str(path)!r}: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise ConfigError(f"{flag} {str(path)!r} is larger than {max_bytes} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{flag} {str(path)!r} is not UTF-8 text (byte {e.start}: {e.reason}); "
                          "save it as UTF-8") from None


def load_yaml(text: str, where: str):
    """`yaml.safe_load` that refuses anchors and aliases (`&a`, `*a`, `<<: *a`): they can expand a tiny file
    into gigabytes ("billion laughs"), and a settings file never needs them."""
    import yaml  # lazy: optional dependency

    class _NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                mark = event.start_mark
                setting = f"setting {'.'.join(self._keys)!r}" if self._keys else "the top level"
                kind = f"alias *{event.anchor}" if isinstance(event, yaml.AliasEvent) else f"anchor &{event.anchor}"
                raise ConfigError(f"{where}: {setting} (line {mark.line + 1}) uses a YAML {kind}; anchors and "
                                  "aliases are refused (a few hundred bytes of them expand to gigabytes): write "
                                  "the value out")
            return super().compose_node(parent, index)

        def compose_mapping_node(self, anchor):  # track the keys above the node being composed
            node = yaml.MappingNode(self.resolve(yaml.MappingNode, None, True), [], None, None, None)
            start = self.get_event()
            node.tag = start.tag if start.tag not in (None, "!") else node.tag
            node.start_mark, node.flow_style = start.start_mark, start.flow_style
            while not self.check_event(yaml.MappingEndEvent):
                key = self.compose_node(node, None)
                self._keys.append(str(key.value) if isinstance(key, yaml.ScalarNode) else "?")
                try:
                    value = self.compose_node(node, key)
                finally:
                    self._keys.pop()
                node.value.append((key, value))
            node.end_mark = self.get_event().end_mark
            return node

    _NoAliasLoader._keys = []

    loader = _NoAliasLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_data_file(path: str | Path, flag: str):
    """A JSON or YAML file given by `flag`; an unreadable, oversized or malformed file (or YAML with
    anchors/aliases) is one ConfigError naming it."""
    text = read_text_file(flag, path)
    yaml_file = Path(path).suffix in (".yaml", ".yml")
    try:
        if yaml_file:
            return load_yaml(text, f"{flag} {str(path)!r}")
        return json.loads(text)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - any parse error of the user's file is one clear line
        raise ConfigError(f"{flag} {str(path)!r} is not valid {'YAML' if yaml_file else 'JSON'}: "
                          f"{str(e).splitlines()[0]}") from None


def parse_json_lines(text: str, where: str) -> list:
    """The records of a JSON Lines text (one JSON value per line). A file holding one JSON array instead (on one
    line or pretty-printed), or one object spread over several lines, is named as what it is, with the fix."""
    fix = "write one object per line, or name the file .json"
    if text.lstrip().startswith(("[", "{")):
        try:
            whole = json.loads(text)
        except json.JSONDecodeError:
            whole = None  # several lines of JSON Lines, or broken: read line by line below
        if isinstance(whole, list):
            raise ConfigError(f"{where} holds one JSON array of {len(whole)} records, not JSON Lines (one JSON "
                              f"object per line); {fix}")
        if isinstance(whole, dict) and len(text.strip().splitlines()) > 1:
            raise ConfigError(f"{where} holds one JSON object over {len(text.strip().splitlines())} lines, not JSON "
                              f"Lines (one JSON object per line); {fix}")
    rows = []
    for i, line in enumerate(text.splitlines()):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ConfigError(f"{where}: line {i + 1} is not valid JSON ({e}); expected one JSON object per "
                                  "line (JSON Lines)") from None
    return rows


def check_text_table(name: str, table) -> dict[str, str]:
    """A ROLE=TEXT argument of the Python API (role_models, ckpt_override): None or a dict of strings."""
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise ConfigTypeError(f"{name}: expected a dict ROLE -> text, got {type(table).__name__}")
    for key, value in table.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ConfigTypeError(f"{name} {key!s:.40}={value!r:.40}: expected ROLE -> text, got "
                            f"{type(key).__name__} -> {type(value).__name__}")
    return dict(table)


def check_question(name: str, question, *, max_chars: int = MAX_QUESTION_CHARS) -> str:
    """A question must be a non-empty string of at most `max_chars` characters (TypeError / ValueError)."""
    if not isinstance(question, str):
        raise ConfigTypeError(f"{name}: expected a string, got {type(question).__name__}")
    if not question.strip():
        raise ValueError(f"{name}: empty question")
    if len(question) > max_chars:
        raise ValueError(f"{name}: {len(question)} characters; expected at most {max_chars} "
                         "(is a whole file in one question?)")
    return question


def check_keys_file(flag: str, path) -> None:
    """The search keys file: a readable regular UTF-8 file of one key per line (blank and # lines skipped) that
    only its owner may read (keys are secrets). What is wrong with its content is said before its mode (a
    wrong file is the cause, not its permissions); no key ever appears in a message."""
    text = read_text_file(flag, path, max_bytes=1 << 20)
    keys = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    if not keys:
        raise ConfigError(f"{flag} {str(path)!r} holds no key; expected one API key per line")
    bad = next((n for n, k in enumerate(keys, start=1) if any(c.isspace() for c in k) or not k.isprintable()), None)
    if bad is not None:
        raise ConfigError(f"{flag} {str(path)!r}: key line {bad} holds spaces or control characters; expected one "
                          "API key per line (is this the right file?)")
    check_file(flag, path, private=True)


def cuda_available() -> bool:
    """Whether torch sees a CUDA GPU (imports torch: call only when a setting asks for CUDA)."""
    import torch  # lazy: torch must not load with --help or before a job's first line

    return bool(torch.cuda.is_available())


def check_cuda(flag: str, why: str = "", *, on_cluster: bool = False, plan_hint: bool = False,
               cpu_flag: str = "") -> None:
    """Refuse a setting that needs CUDA on a machine where torch sees no GPU, naming the flags that change it.
    `on_cluster`: the GPUs are wanted by Ray workers, which may run on other nodes; with a cluster named
    (RAY_ADDRESS, as `ray job submit` sets it) this machine's GPUs say nothing, so only a local run is checked.
    `plan_hint`: a --dry_run, which can plan for another machine's GPUs instead. `cpu_flag`: the CPU setting."""
    if on_cluster and os.environ.get("RAY_ADDRESS", "").strip() not in ("", "local"):
        return
    if not cuda_available():
        cpu = cpu_flag or ("--placement cpu" if flag.startswith(("--placement", "--role_gpus")) else
                           "--no_use_gpu" if flag == "--use_gpu" else "--device cpu")
        plan = (", or plan for a GPU machine from here with --placement.plan_node_gpus N (GPUs per node, e.g. 8) "
                "and --placement.gpu_memory_gib GIB") if plan_hint else ""
        raise ConfigError(f"{flag}{' ' + why if why else ''}: torch sees no CUDA GPU on this machine; "
                          f"run where one is visible (CUDA_VISIBLE_DEVICES) or choose the CPU ({cpu}){plan}")


def check_ray_address(flag: str, address: str, *, timeout_s: float = 10.0) -> None:
    """A Ray cluster address (host:port or ray://host:port) must accept a TCP connection within `timeout_s`,
    so a dead address is one line instead of a hang; `auto` / `local` are left to Ray."""
    if address in ("auto", "local"):
        return
    target = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(f"{flag} {address!r}: expected HOST:PORT or ray://HOST:PORT (or auto)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConfigError(f"{flag} {address!r}: no Ray cluster answers there within {timeout_s:g} s "
                          f"({e.strerror or e}); start one (`ray start --head`) or fix the address") from None


def model_name_problem(name) -> str | None:
    """Why a Hugging Face id or local path cannot load, checked without loading anything, or None (the question
    `models.registry` asks for names of that kind; its other kinds answer for themselves).

    A name that looks like a path must be a model directory (config.json); a Hub id must be in the local cache, or
    (not HF_HUB_OFFLINE) answer one request to the Hub (`hub_model_problem`).
    """
    if not isinstance(name, str):
        return f"expected a model name (string), got {type(name).__name__}"
    if not name.strip():
        return "is empty"
    p = Path(name).expanduser()
    looks_local = name.startswith((".", "/", "~")) or p.exists() or name.count("/") > 1
    if looks_local:
        if not p.exists():
            return "is no model directory (no such path) and not a Hugging Face id ORG/NAME"
        if not p.is_dir():
            return "is a file; expected a model directory holding config.json, or a Hugging Face id"
        if not (p / "config.json").is_file():
            return "is a directory without config.json; expected a model directory"
        return None
    try:
        from huggingface_hub import try_to_load_from_cache  # lazy: the Hub client (~0.3 s) loads only for Hub access

        found = try_to_load_from_cache(name, "config.json")
    except Exception:  # noqa: BLE001 - a malformed id
        found = None
    if isinstance(found, str):
        return None
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "is not in the local Hugging Face cache and HF_HUB_OFFLINE is set"
    return hub_model_problem(name)


HUB_PROBE_TIMEOUT_S = 1.5
"""How long one look-up of an uncached model id on the Hub may take (transformers would retry for ~50 s)."""


def hub_model_problem(name: str) -> str | None:
    """One request to the Hub (`HF_ENDPOINT`) for a model id that is not cached: None when it exists (or is
    gated/private: the token decides later), else why it cannot load. Never retried, so an unknown id or an
    unreachable Hub fails in about `HUB_PROBE_TIMEOUT_S`."""
    from huggingface_hub import HfApi  # lazy: the Hub client (~0.3 s) loads only for Hub access
    # lazy: the Hub client (~0.3 s) loads only for Hub access
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    try:
        HfApi().model_info(name, timeout=HUB_PROBE_TIMEOUT_S)
    except GatedRepoError:
        return None
    except RepositoryNotFoundError:
        return "is no model on the Hugging Face Hub (not found) and not in the local cache"
    except HfHubHTTPError as e:
        code = getattr(getattr(e, "response", None), "status_code", None)
        if code in (401, 403):  # private or gated: the user's token decides when the model loads
            return None
        return f"is not in the local Hugging Face cache and the Hub answered HTTP {code}"
    except Exception as e:  # noqa: BLE001 - no network, DNS, timeout: the transport's own error types
        return (f"is not in the local Hugging Face cache and the Hub cannot be reached ({type(e).__name__}); "
                "pass a local model directory, or set HF_HUB_OFFLINE=1 to use only the cache")
    return None


class OutputLock:
    """An exclusive `fcntl.flock` on `<folder>/.lock` for the life of a run; a second run into the same folder
    fails at once, naming the first one's PID. The kernel drops the lock when the process dies."""

    def __init__(self, folder: str | os.PathLike, flag: str = "--output_path"):
        self.folder, self.flag, self._fd = Path(folder), flag, None

    def __enter__(self) -> "OutputLock":
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise ConfigError(f"{self.flag} {str(self.folder)!r} is in use by another run (PID {other}); "
                                  "wait for it to end or use another folder") from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the flock
            self._fd = None
