"""The phase-diagram sweep in process: the equiangular curve, the store, resuming."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import xarray as xr
from scipy.integrate import solve_ivp

from tokenfield.errors import UserError
from tokenfield.meanfield.phase import (
    PhaseDiagramConfig,
    SweepReport,
    equiangular_merge_time,
    equiangular_rate,
    merged_fraction,
    phase_diagram,
)

TINY = PhaseDiagramConfig(
    dims=(2, 6), betas=(0.0, 1.0, 3.0), t_max=4.0, frames=9, n_particles=6, n_systems=3, dt=0.1
)


@pytest.mark.parametrize("normalization", ["sa", "usa"])
def test_equiangular_merge_time_solves_the_scalar_ode(normalization):
    n, delta = 8, 0.1
    for beta in (0.0, 2.0, 5.0):
        t_star = equiangular_merge_time(beta, n, delta, normalization)
        ode = solve_ivp(
            lambda t, r, beta=beta: [equiangular_rate(r[0], beta, n, normalization)],
            (0, t_star),
            [0.0],
            rtol=1e-11,
            atol=1e-13,
            method="DOP853",
        )
        assert ode.y[0, -1] == pytest.approx(1 - delta, abs=1e-8)
    assert math.isinf(equiangular_merge_time(9.0, n, delta, "sa", t_max=1.0))


def test_merged_fraction_counts_pairs():
    x = np.zeros((2, 1, 3, 2))
    x[..., 0] = 1.0  # all three tokens at e_1 ...
    x[1, 0, 2] = [0.0, 1.0]  # ... except one in the second system
    assert merged_fraction(x, 0.1, "all").tolist() == [pytest.approx(4 / 6)]
    assert merged_fraction(x, 0.1, "first").tolist() == [1.0]


def test_the_sweep_writes_regions_and_resumes(tmp_path):
    report = SweepReport(0, 0, "")
    memory = phase_diagram(TINY)
    stored = phase_diagram(TINY, store=tmp_path / "p.zarr", report=report)
    assert report.tasks_run == len(TINY.blocks()) == 4
    assert np.array_equal(memory.merged_probability.values, stored.merged_probability.values)
    assert stored.completed.values.all()
    assert stored.merged_probability.dims == ("dim", "beta", "time")
    prob = stored.merged_probability.values
    assert np.all((prob >= 0) & (prob <= 1)) and prob[:, :, 0].max() < 0.5
    # plain xarray opens it, with the config
    plain = xr.open_zarr(tmp_path / "p.zarr")
    assert json.loads(plain.attrs["tokenfield_config"]) == TINY.to_dict()
    assert PhaseDiagramConfig.from_dict(TINY.to_dict()) == TINY
    again = SweepReport(0, 0, "")
    phase_diagram(TINY, store=tmp_path / "p.zarr", report=again)
    assert (again.tasks_run, again.tasks_skipped) == (0, 4)
    # every chunk checksummed: a flipped byte is an error on read, not a wrong number
    meta = json.loads((tmp_path / "p.zarr" / "merged_probability" / "zarr.json").read_text())
    assert [c["name"] for c in meta["codecs"]] == ["bytes", "crc32c"]
    chunk = next(
        p for p in (tmp_path / "p.zarr" / "merged_probability" / "c").rglob("*") if p.is_file()
    )
    raw = bytearray(chunk.read_bytes())
    raw[3] ^= 0x40
    chunk.write_bytes(bytes(raw))
    with pytest.raises(Exception, match="(?i)checksum|crc"):
        xr.open_zarr(tmp_path / "p.zarr")["merged_probability"].load()
    with pytest.raises(UserError):
        phase_diagram(PhaseDiagramConfig(dims=(2,), betas=(1.0,)), store=tmp_path / "p.zarr")
    with pytest.raises(UserError):
        phase_diagram(TINY, executor="dask")  # a Dask sweep needs a store


def test_high_dimensions_follow_the_equiangular_curve():
    """d >> n: random starts are nearly orthogonal, so the pairs merge close to the
    equiangular time (SA, beta = 2: t* = 3.1)."""
    config = PhaseDiagramConfig(
        dims=(64,), betas=(2.0,), t_max=6.0, frames=25, n_particles=4, n_systems=8, dt=0.05
    )
    ds = phase_diagram(config)
    t_star = float(ds.equiangular_time.item())
    prob = ds.merged_probability.sel(dim=64, beta=2.0)
    assert prob.sel(time=t_star - 1.0, method="nearest") < 0.2
    assert prob.sel(time=t_star + 1.0, method="nearest") > 0.8
