"""The replication prompt sets: fresh prompts in the seed's categories and groups.

The seed's claims are confirmed on these sets after every choice (a layer, a
block) was made on the seed prompts, so they must hold enough prompts per group
and share no prompt, nor a near-copy of one, with the seed sets.
"""

import difflib
import re
from collections import Counter
from itertools import combinations

import pytest

from tokenfield.prompts import BUNDLED_SETS, load_prompts

PAIRS = [("replication-categories", "seed-categories"), ("replication-spectrum", "seed-spectrum")]
#: difflib similarity of two normalised texts at or above which they are near-copies
NEAR = 0.7


def normalised(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower()).strip()


def similarity(a: str, b: str) -> float:
    """difflib's ratio, or its cheap upper bound when that is already below 0.6."""
    matcher = difflib.SequenceMatcher(None, normalised(a), normalised(b))
    bound = matcher.quick_ratio()
    return bound if bound < 0.6 else matcher.ratio()


@pytest.mark.parametrize(("replication", "seed"), PAIRS)
def test_same_groups_as_the_seed_set_with_at_least_30_prompts_each(replication, seed):
    assert replication in BUNDLED_SETS
    prompts = load_prompts(replication)
    seed_groups = list(dict.fromkeys(p.category for p in load_prompts(seed)))
    counts = Counter(p.category for p in prompts)
    assert list(counts) == seed_groups  # the same groups, in the seed's order
    assert min(counts.values()) >= 30, counts
    labels = [p.label for p in prompts]
    assert labels == [f"R{i}" for i in range(1, len(prompts) + 1)]


@pytest.mark.parametrize(("replication", "seed"), PAIRS)
def test_no_prompt_shared_with_or_nearly_copied_from_a_seed_prompt(replication, seed):
    fresh = [p.text for p in load_prompts(replication)]
    seeds = [p.text for name in ("seed-categories", "seed-spectrum") for p in load_prompts(name)]
    assert not {normalised(t) for t in fresh} & {normalised(t) for t in seeds}
    closest = max((similarity(f, s), f, s) for f in fresh for s in seeds)
    assert closest[0] < NEAR, f"near-copy of a seed prompt: {closest}"


def test_the_replication_sets_hold_no_duplicates_within_or_between_them():
    prompts = [p for name, _ in PAIRS for p in load_prompts(name)]
    assert len({normalised(p.text) for p in prompts}) == len(prompts)
    closest = max(  # near-copies within a group (across groups they would not be copies)
        (similarity(a.text, b.text), a.text, b.text)
        for a, b in combinations(prompts, 2)
        if a.category == b.category
    )
    assert closest[0] < 0.8, f"near-duplicate replication prompts: {closest}"


def test_the_spectrum_subgroups_the_seed_singled_out_are_represented():
    """Prompt 15 is a docstring in code syntax (''' ... '''), prompt 17 pseudocode with
    a numeral: the replication tests them as classes, so both sides need prompts."""
    spectrum = load_prompts("replication-spectrum")
    docstrings = [p.text for p in spectrum if p.category == "Docstrings"]
    quoted = [t for t in docstrings if t.lstrip().startswith(("'''", '"""'))]
    assert len(quoted) >= 10 and len(docstrings) - len(quoted) >= 10
    pseudocode = [p.text for p in spectrum if p.category == "Pseudocode"]
    numerals = [t for t in pseudocode if re.search(r"\d", t)]
    assert len(numerals) >= 10 and len(pseudocode) - len(numerals) >= 10
