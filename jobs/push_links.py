r"""Publish trained links on the Hugging Face Hub with a model card; `links=ORG/NAME` reads them back.

    python -m jobs.push_links out/demo/links --repo my-org/recmas-sequential-light
    python -m jobs.push_links out/demo/links --repo my-org/recmas-sequential-light --private --revision v1
    python -m jobs.push_links out/demo/links --repo my-org/x --dry_run --staging_dir /tmp/card   # look first

FOLDER is a system folder (one sub-folder per role with its inner links, and `outer/`), as `System.build(links=)`
reads it. Only the link files, manifests, configs and held-out curves are published (never optimizer state, Ray
run folders or base-model weights), with a README.md model card built from the manifests
(`recmas_ray/system/card.py`). The token comes from `HF_TOKEN` or `huggingface-cli login`; it is never printed.
Afterwards: `System.build(STYLE, links="ORG/NAME")`, `--links ORG/NAME` in jobs.run and jobs.serve, or
`--ckpt_override ROLE=ORG/NAME:ROLE`. Every link kind of the folder is published as it is saved (the manifests name
each link's kind and arguments; a token link's tables are the base models' own embeddings, never uploaded).
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from recmas_ray.config.cli import run_job
from recmas_ray.console import Console
from recmas_ray.models.registry import model_kind
from recmas_ray.styles import get_style
from recmas_ray.system.hub import parse_hub_id


@dataclass(kw_only=True)
class PushLinksConfig:
    """Which system folder goes to which Hub repo."""

    folder: str
    """The system folder to publish (sub-folders per role and outer/); also the first positional argument."""
    repo: str
    """Hub repo id ORG/NAME (created as a model repo if it does not exist)."""
    revision: str | None = None
    """Branch to push to (created from main if missing); None: main."""
    private: bool = False
    """Create the repo as private (an existing repo keeps its visibility)."""
    commit_message: str = "Upload RecursiveMAS links"
    """Commit message of the upload."""
    dry_run: bool = False
    """Stage the files and the card locally (see --staging_dir) and upload nothing."""
    staging_dir: str | None = None
    """Where the staged copy goes (must not exist); None: a temporary folder, removed after the upload."""
    allow_incomplete: bool = False
    """Publish a folder that lacks some of its style's link folders (a role's, or outer/); refused otherwise,
    since `links=` would then run fresh random links for the missing ones."""
    allow_random_bases: bool = False
    """Publish links trained on random-weight tiny: models (refused otherwise: they mean nothing elsewhere)."""

    def validate(self) -> None:
        """Repo id, branch and staging path, and the folder's layout and manifests (before anything is written)."""
        # lazy: imports torch; --help must not
        from recmas_ray.system.card import read_system_folder

        ref = parse_hub_id(self.repo)
        if ref is None or ref.revision or ref.subfolder:
            raise ValueError(f"--repo {self.repo!r}: expected a Hub repo id ORG/NAME (the branch goes in --revision)")
        if self.revision is not None and not self.revision.strip():
            raise ValueError("--revision '': expected a branch name, or leave it out for main")
        if self.staging_dir is not None and (not self.staging_dir.strip() or Path(self.staging_dir).exists()):
            raise ValueError(f"--staging_dir {self.staging_dir!r}: expected a path that does not exist yet")
        check_publishable(read_system_folder(self.folder), allow_incomplete=self.allow_incomplete,
                          allow_random_bases=self.allow_random_bases)


def check_publishable(manifests: dict[str, dict], *, allow_incomplete: bool, allow_random_bases: bool) -> None:
    """A system folder worth publishing: every link folder of its style (roles and outer/) and real base models."""
    styles = sorted({m["style"] for m in manifests.values() if isinstance(m.get("style"), str)})
    if not allow_incomplete:
        expected = set(get_style(styles[0]).roles) | {"outer"} if len(styles) == 1 else {"outer"}
        missing = sorted(expected - set(manifests))
        if missing:
            raise ValueError(f"--folder holds {sorted(manifests)} but not {missing} of style "
                             f"{styles[0] if styles else '?'}: `links=` would run fresh random links there; train "
                             "them (train_inner / train_outer) or pass --allow_incomplete")
    if not allow_random_bases:
        bases = {str(info.get("base_model", "")) for m in manifests.values()
                 for info in (m.get("roles") or {}).values() if isinstance(info, dict)} \
            | {str(m.get("base_model", "")) for m in manifests.values()}
        tiny = sorted(b for b in bases if model_kind(b).random_weights)
        if tiny:
            raise ValueError(f"--folder: links trained on random-weight test models {tiny}, which mean nothing to "
                             "anyone else; train on real models (--preset demo|paper) or pass --allow_random_bases")


def push_links(cfg: PushLinksConfig, *, api=None) -> dict:
    """Stage `cfg.folder` with its card and upload it with `api` (a `huggingface_hub.HfApi`, made here if None).

    Returns what was done: the repo, the staged files, the commit URL (None for a dry run).
    """
    from recmas_ray.system.card import stage_system_folder  # lazy: imports torch; --help must not

    cfg.validate()  # every check before anything is written or uploaded (run_job ran it too)
    with tempfile.TemporaryDirectory(prefix="recmas-push-") as tmp:
        staging = stage_system_folder(cfg.folder, cfg.staging_dir or Path(tmp) / "repo", cfg.repo)
        files = sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file())
        if cfg.dry_run:
            return {"repo": cfg.repo, "staged": str(staging) if cfg.staging_dir else None, "files": files,
                    "commit": None}
        if api is None:
            from huggingface_hub import HfApi  # lazy: huggingface_hub is needed only for a real push

            api = HfApi()
        try:
            api.create_repo(cfg.repo, repo_type="model", private=cfg.private, exist_ok=True)
            if cfg.revision:
                api.create_branch(cfg.repo, branch=cfg.revision, repo_type="model", exist_ok=True)
            info = api.upload_folder(folder_path=str(staging), repo_id=cfg.repo, repo_type="model",
                                     revision=cfg.revision, commit_message=cfg.commit_message)
        except Exception as e:  # noqa: BLE001 - auth, network, offline: one line naming the repo (no token in it)
            reason = " ".join(str(e).split())[:300] or type(e).__name__
            raise RuntimeError(f"upload to {cfg.repo!r} failed: {type(e).__name__}: {reason}") from None
    return {"repo": cfg.repo, "staged": str(cfg.staging_dir) if cfg.staging_dir else None, "files": files,
            "commit": str(getattr(info, "commit_url", info))}


def run(cfg: PushLinksConfig) -> int:
    """The job: its phase line on stderr (continuing "checking inputs ..."), the result as JSON on stdout."""
    console = Console(job=True)
    console.start(f"staging {cfg.folder} for {cfg.repo}" if cfg.dry_run else f"uploading {cfg.folder} to {cfg.repo}")
    try:
        out = push_links(cfg)
    except BaseException as e:
        if isinstance(e, (ValueError, TypeError)):
            console.drop_open()
        console.finish_open(e)
        raise
    console.done(f"{len(out['files'])} files")
    print(json.dumps(out, indent=2))
    return 0


def main(argv=None) -> int:
    """`push_links FOLDER --repo ORG/NAME ...`; returns the exit status (2: bad input, nothing uploaded; 130
    interrupted: an upload is one commit, so the Hub has all of it or nothing)."""
    announce = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-"):
        argv = ["--folder", argv[0], *argv[1:]]
    return run_job(run, PushLinksConfig, argv, prog="push_links", description=__doc__, announce=announce,
                   on_interrupt="nothing more is uploaded (one upload is one commit: the repo has all of it or none)")


if __name__ == "__main__":
    sys.exit(main())
