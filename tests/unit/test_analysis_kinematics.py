"""Kinematics on paths whose answers are known: lines, circles, corners, jumps."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.synthetic_trajectories import straight_lines, trace_dataset
from tokenfield.analysis import fit_projection, kinematics, project, vector_angle


def test_straight_line_has_constant_steps_and_no_turning():
    ds = trace_dataset(straight_lines(), ["a"] * 6)
    kin = kinematics(ds, project(ds, fit_projection(ds)))
    assert kin["step"].values.tolist() == list(range(1, 12))
    np.testing.assert_allclose(kin["step_length"].values, 2.0, rtol=1e-5)
    np.testing.assert_allclose(kin["speed"].values, kin["step_length"].values)
    assert np.isnan(kin["turning_angle"].values[0]).all()
    np.testing.assert_allclose(kin["turning_angle"].values[1:], 0.0, atol=1e-3)
    # a straight path is a straight line in the PCA plane: constant dPC2/dPC1
    velocity = kin["velocity"].values
    np.testing.assert_allclose(velocity, np.broadcast_to(velocity[:1], velocity.shape), rtol=1e-3)


def test_circle_turns_by_its_angular_step():
    theta = 0.3
    t = np.arange(20)
    circle = np.stack([np.cos(theta * t), np.sin(theta * t)], axis=-1)[:, None, :]  # (20, 1, 2)
    kin = kinematics(trace_dataset(circle, ["a"]))
    np.testing.assert_allclose(kin["turning_angle"].values[1:], theta, rtol=1e-4)
    np.testing.assert_allclose(kin["angular_step"].values, theta, rtol=1e-4)
    chord = 2 * np.sin(theta / 2)
    np.testing.assert_allclose(kin["step_length"].values, chord, rtol=1e-5)
    np.testing.assert_allclose(kin["relative_step"].values, chord, rtol=1e-5)
    np.testing.assert_allclose(kin["norm"].values, 1.0, rtol=1e-6)


def test_right_angle_and_reversal():
    path = np.array([[0, 0], [1, 0], [1, 1], [1, 0]], dtype=float)[:, None, :] + 5.0
    kin = kinematics(trace_dataset(path, ["a"]))
    np.testing.assert_allclose(kin["turning_angle"].values[1:, 0], [np.pi / 2, np.pi], rtol=1e-6)


def test_fastest_step_finds_the_jump():
    rng = np.random.default_rng(0)
    states = np.cumsum(0.1 * rng.normal(size=(15, 4, 8)), axis=0) + 10.0
    states[5:, 2] += 7.0  # particle 2 jumps into layer 5
    kin = kinematics(trace_dataset(states, ["a", "a", "b", "b"]))
    assert kin["fastest_step"].values[2] == 5
    assert kin["fastest_relative_step"].values[2] == 5


def test_simulation_time_steps_scale_speed():
    times = np.array([0.0, 0.5, 1.5, 1.75])
    states = np.array([[0, 1], [1, 1], [2, 1], [3, 1]], dtype=float)[:, None, :]
    kin = kinematics(trace_dataset(states, None, time=times))
    np.testing.assert_allclose(kin["step_length"].values[:, 0], 1.0)
    np.testing.assert_allclose(kin["speed"].values[:, 0], [2.0, 1.0, 4.0])
    assert kin["step"].values.tolist() == [0.5, 1.5, 1.75]


def test_vector_angle_is_accurate_for_tiny_angles():
    u = np.array([1.0, 0.0])
    w = np.array([np.cos(1e-6), np.sin(1e-6)])
    assert vector_angle(u, w) == pytest.approx(1e-6, rel=1e-6)
    assert np.isnan(vector_angle(u, np.zeros(2)))
