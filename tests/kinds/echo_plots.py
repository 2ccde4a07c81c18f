"""The ``echo`` test kind's plot: its sum against the closed form, drawn from the stored result only."""

from __future__ import annotations

from matplotlib.figure import Figure

from plots.registry import JobData, PlotDataMissingError, PlotSpec
from tests.kinds.echo import KIND


def _draw(figure: Figure, data: JobData) -> None:
    size = data.result.get("size")
    if size is None:
        raise PlotDataMissingError("the result has no size")
    ax = figure.add_subplot()
    closed_form = (size - 1) * size * (2 * size - 1) // 6
    ax.bar(["sum of squares", "closed form"], [float(data.result["sum_of_squares"]), float(closed_form)])
    ax.set_ylabel("sum")


PLOTS = [PlotSpec("sum", "The sum against its closed form", (KIND,), _draw)]
