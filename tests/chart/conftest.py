"""The chart, loaded once per session for every chart suite."""

from __future__ import annotations

import helm_python
import pytest

from tests.chart.helm import CHART


@pytest.fixture(scope="session")
def chart():
    with helm_python.Chart.load(CHART) as loaded:
        yield loaded
