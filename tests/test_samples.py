"""The committed samples in tests/data are the first lines of ../shared/data (tests/data/make_samples.py)."""

from __future__ import annotations

import importlib.util

from .conftest import DATA, SAMPLES, needs_data


@needs_data
def test_committed_samples_equal_the_shared_data():
    spec = importlib.util.spec_from_file_location("make_samples", SAMPLES / "make_samples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    expected = module.samples(DATA)
    assert len(expected) == 6 * 3 + 2
    for name, content in expected.items():
        assert (SAMPLES / name).read_bytes() == content, name
