"""The phase-diagram sweep on Dask gives the same numbers as in process."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr

from tokenfield.meanfield.phase import PhaseDiagramConfig, SweepReport, phase_diagram

CONFIG = PhaseDiagramConfig(
    dims=(2, 5, 12),
    betas=(0.0, 1.0, 2.5, 4.0, 6.0),
    t_max=6.0,
    frames=13,
    n_particles=6,
    n_systems=4,
    dt=0.1,
    beta_block=2,
)


@pytest.fixture(scope="module")
def in_process():
    threads = torch.get_num_threads()
    try:
        return phase_diagram(CONFIG)
    finally:
        torch.set_num_threads(threads)


def test_local_dask_cluster_matches_in_process(in_process, tmp_path):
    report = SweepReport(0, 0, "")
    threads = torch.get_num_threads()
    ds = phase_diagram(
        CONFIG, store=tmp_path / "sweep.zarr", executor="dask", n_workers=2, report=report
    )
    assert torch.get_num_threads() == threads  # the caller's setting is restored
    assert report.executor == "dask" and len(report.workers) == 2
    assert report.tasks_run == len(CONFIG.blocks()) == 9
    assert np.array_equal(ds.merged_probability.values, in_process.merged_probability.values)
    assert np.array_equal(ds.equiangular_time.values, in_process.equiangular_time.values)
    # the store, opened with plain xarray, holds the same numbers
    plain = xr.open_zarr(tmp_path / "sweep.zarr")
    assert np.array_equal(plain.merged_probability.values, in_process.merged_probability.values)
    assert plain.merged_probability.encoding["chunks"] == (1, 2, CONFIG.frames)


def test_an_existing_scheduler_with_process_workers(in_process, tmp_path):
    """--scheduler ADDRESS: worker processes (as on other machines) write their regions."""
    from dask.distributed import LocalCluster

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        report = SweepReport(0, 0, "")
        ds = phase_diagram(
            CONFIG,
            store=tmp_path / "remote.zarr",
            scheduler=cluster.scheduler_address,
            report=report,
        )
    assert report.scheduler == cluster.scheduler_address
    assert np.array_equal(ds.merged_probability.values, in_process.merged_probability.values)


def test_a_half_done_store_is_resumed_on_dask(in_process, tmp_path):
    from tokenfield.meanfield.phase import create_store, write_block

    store = tmp_path / "half.zarr"
    create_store(CONFIG, store)
    for task in CONFIG.blocks()[:4]:
        write_block(CONFIG, store, *task)
    report = SweepReport(0, 0, "")
    ds = phase_diagram(CONFIG, store=store, executor="dask", report=report)
    assert (report.tasks_run, report.tasks_skipped) == (5, 4)
    assert np.array_equal(ds.merged_probability.values, in_process.merged_probability.values)
