import pytest

from tokenfield.errors import UserError
from tokenfield.models.sites import FAMILIES, family_for, site_names


def test_registry_knows_the_families():
    assert family_for("llama").name == "llama"
    assert family_for("gemma3_text").blocks == "layers"
    assert family_for("qwen3").final_norm == "norm"
    assert family_for("gpt2").final_norm == "ln_f"
    assert family_for("bert").final_norm is None and not family_for("bert").causal
    types = [t for f in FAMILIES for t in f.model_types]
    assert len(types) == len(set(types))  # one family per model type


def test_unknown_model_type_is_a_clear_error():
    with pytest.raises(UserError, match="'mamba' is not supported.*add a Family entry"):
        family_for("mamba")


def test_site_names():
    assert site_names(3) == ["embed", "block.0", "block.1", "block.2"]
