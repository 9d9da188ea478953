"""Field help without the source: the shipped table matches the sources, and --help falls back to it."""

import inspect
import json

import pytest

from recmas_ray.config import field_docs
from recmas_ray.config.cli import leaves
from recmas_ray.eval.config import EvalConfig
from recmas_ray.train.config import OuterTrainConfig


def test_the_shipped_table_matches_the_sources():
    shipped = json.loads(field_docs.DOCS_FILE.read_text(encoding="utf-8"))
    assert shipped == field_docs.collect(), "run: python -m recmas_ray.config.field_docs"
    assert "recmas_ray.eval.config.EvalConfig" in shipped and "recmas_ray.train.config.OuterTrainConfig" in shipped


@pytest.mark.parametrize("cls", [EvalConfig, OuterTrainConfig])
def test_help_is_the_same_without_the_source(cls, monkeypatch):
    with_source = {leaf.path: leaf.doc for leaf in leaves(cls)}
    assert sum(bool(d) for d in with_source.values()) >= 0.9 * len(with_source)  # nearly every field has help

    def no_source(obj):
        raise OSError("could not get source code")  # what inspect says where only .pyc files are installed

    monkeypatch.setattr(inspect, "getsource", no_source)
    assert {leaf.path: leaf.doc for leaf in leaves(cls)} == with_source
    monkeypatch.setattr(field_docs, "_shipped", lambda: {})  # and without the table the help is empty: it is used
    assert not any(leaf.doc for leaf in leaves(cls))
