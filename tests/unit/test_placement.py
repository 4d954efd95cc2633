"""--device-map / --max-memory / --offload-folder validation and the input device
of a spread model (pure; no GPU needed)."""

from __future__ import annotations

import pytest
import torch

from tokenfield.errors import UserError
from tokenfield.models.placement import Placement, input_device, parse_max_memory


def test_parse_max_memory_forms():
    assert parse_max_memory("cpu=2GiB, disk=10GB") == {"cpu": "2GiB", "disk": "10GB"}
    assert parse_max_memory({"cpu": "500MB"}) == {"cpu": "500MB"}
    assert parse_max_memory(None) is None


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("cpu", "has no '='"),
        ("cpu=lots", "bad size"),
        ("cpu=0", "bad size"),
        ("tpu=1GB", "unknown device 'tpu'"),
        (",", "is empty"),
    ],
)
def test_bad_max_memory(value, said):
    with pytest.raises(UserError, match=said):
        parse_max_memory(value)


def test_a_gpu_this_machine_lacks_is_refused():
    missing = torch.cuda.device_count()  # one past the last GPU (0 on a CPU machine)
    with pytest.raises(UserError, match=f"names GPU {missing}"):
        parse_max_memory(f"cuda:{missing}=1GiB,cpu=1GiB")


def test_placement_flags_together(tmp_path):
    with pytest.raises(UserError, match="needs --device-map"):
        Placement.parse(None, "cpu=1GB")
    with pytest.raises(UserError, match="needs --device-map"):
        Placement.parse(None, None, tmp_path)
    with pytest.raises(UserError, match="unknown --device-map 'everywhere'"):
        Placement.parse("everywhere")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UserError, match="cannot create --offload-folder"):
        Placement.parse("auto", None, blocker / "sub")
    placed = Placement.parse("sequential", "cpu=1MB", tmp_path / "off")
    assert placed.from_pretrained_kwargs() == {
        "device_map": "sequential",
        "max_memory": {"cpu": "1MB"},
        "offload_folder": str(tmp_path / "off"),
    }
    assert (tmp_path / "off").is_dir()
    # the same flags again from what a Dask worker receives
    again = placed.load_args()
    assert Placement.parse(again["device_map"], again["max_memory"], again["offload_folder"]) == (
        placed
    )


def test_input_device_of_a_device_map():
    """The device a spread model's inputs go to: its first module's; the CPU for disk."""
    assert input_device({"model.embed": 0, "lm_head": 1}) == torch.device("cuda", 0)
    assert input_device({"model.embed": "cuda:1"}) == torch.device("cuda", 1)
    assert input_device({"model.embed": "disk", "x": 0}) == torch.device("cpu")
    assert input_device({"": "cpu"}) == torch.device("cpu")
