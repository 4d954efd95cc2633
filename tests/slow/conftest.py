"""Bundled real models, each loaded once per test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2():
    import tokenfield as tf

    return tf.load_model("smollm2")


@pytest.fixture(scope="session")
def gemma():
    import tokenfield as tf

    return tf.load_model("gemma3-270m")


@pytest.fixture(scope="session")
def minilm():
    import tokenfield as tf

    return tf.load_model("minilm")
