"""The registry is the one list of rules: each rule one module, named after its id, that no
other rule imports, and the README's rule table names exactly the registered rules."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import grimp
import pytest

from sentinel.rules import DETECTORS, STORIES

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("rule", list(DETECTORS))
def test_a_rule_is_the_module_named_after_its_id(rule: str) -> None:
    detector = DETECTORS[rule]
    assert detector.rule == rule
    assert detector.__module__ == f"sentinel.rules.{rule}"
    assert detector.config_model.__module__ == f"sentinel.rules.{rule}"


def test_no_rule_imports_another_rule() -> None:
    graph = grimp.build_graph("sentinel", cache_dir=None)
    modules = [detector.__module__ for detector in DETECTORS.values()]
    chains = {
        (importer, imported): graph.find_shortest_chain(importer=importer, imported=imported)
        for importer, imported in itertools.permutations(modules, 2)
    }
    assert {pair: chain for pair, chain in chains.items() if chain is not None} == {}


def test_the_readme_rule_table_names_every_registered_rule() -> None:
    from tests.helpers.manual import section as manual_section

    section = manual_section("What it detects")
    rows = re.findall(r"^\| `(\w+)` \|", section, re.MULTILINE)
    assert sorted(rows) == sorted(DETECTORS)
    assert len(rows) == len(set(rows))


def test_the_rules_of_one_story_are_the_blow_up() -> None:
    """A grad-norm run, a loss spike, a collapsed loss scale and a NaN share an incident."""
    blow_up = dict.fromkeys(("nan_inf", "loss_scale", "grad_norm_run", "loss_spike"), "blow_up")
    assert blow_up == STORIES
