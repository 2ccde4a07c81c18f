"""User text in plots: names, parameters and hypotheses that matplotlib would read as mathtext ("$\\foo$" is an
unknown command) are drawn as typed in every plot of every kind, SVG and PNG; a plot that still cannot be drawn
answers a problem and its job page says "Plot unavailable" instead of failing whole."""

from __future__ import annotations

import functools
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from typing import Any

import pytest
from matplotlib.figure import Figure

from kernels.context import local_context, run_kind
from kernels.progress import LocalProgress
from kernels.registry import registry
from plots.registry import JobData, PlotSpec, all_plots, plots_for, render

pytestmark = pytest.mark.reliability

SVG_TEXT = "{http://www.w3.org/2000/svg}text"
# Each one fails matplotlib's mathtext parser (unknown command, dangling superscript, unclosed group, bad
# fraction) or changes what is drawn when parsed (a pair of "$").
ATTACKS = ("$\\foo$", "$x^$", "${$", "$\\frac{1}$", "a $b$ c", "$$", "\\$\\$")
# Result fields made from user text: covariate and column names, the tested parameter, the hypothesis.
USER_TEXT_KEYS = frozenset({"name", "param", "hypothesis", "text", "bootcluster"})


@functools.cache
def example_run(kind_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    kind = registry()[kind_name]
    progress = LocalProgress()
    ctx = local_context(device="cpu", datasets=kind.example.frames(), progress=progress)
    return run_kind(kind, kind.example.params, ctx), dict(progress.artifacts)


def poisoned(value: Any, attack: str, key: str = "") -> Any:
    """``value`` with every string under a user-text key replaced by the attack (numbered, to tell them apart)."""
    if isinstance(value, dict):
        return {name: poisoned(item, attack, name) for name, item in value.items()}
    if isinstance(value, list):
        return [poisoned(item, attack, key) for item in value]
    if isinstance(value, str) and key in USER_TEXT_KEYS:
        return f"{attack} {key}"
    return value


def job_data(kind_name: str, attack: str) -> JobData:
    result, artifacts = example_run(kind_name)
    return JobData(
        kind=kind_name,
        result=poisoned(result, attack),
        artifact_names=frozenset(artifacts),
        load_artifact=lambda name: artifacts[name],
    )


def svg_texts(document: bytes) -> list[str]:
    return ["".join(node.itertext()) for node in ElementTree.fromstring(document).iter(SVG_TEXT)]


def plotted_kinds() -> Iterator[str]:
    yield from sorted(all_plots())


@pytest.mark.parametrize("attack", ATTACKS)
@pytest.mark.parametrize("kind_name", list(plotted_kinds()))
def test_user_text_is_drawn_as_typed_in_every_plot(kind_name: str, attack: str) -> None:
    data = job_data(kind_name, attack)
    offered = plots_for(data)
    assert [spec.name for spec in offered] == [spec.name for spec in plots_for(job_data(kind_name, "plain"))]
    drawn = []
    for spec in offered:
        texts = svg_texts(render(spec, data, "svg"))
        assert render(spec, data, "png").startswith(b"\x89PNG")
        drawn += [text for text in texts if attack in text]
    user_text_plotted = {"crve_bootstrap": "param", "sccs_fit": "name"}
    if kind_name in user_text_plotted:  # these kinds label their plots with user text: the attack is there verbatim
        assert any(f"{attack} {user_text_plotted[kind_name]}" in text for text in drawn), drawn


def draw_every_text_kind(figure: Figure, data: JobData) -> None:
    """Every way a plot module puts text on a figure, each with the attack."""
    attack = str(data.result["attack"])
    ax = figure.subplots()
    ax.plot([1, 2], [1, 2], label=attack)
    ax.set_xticks([1, 2], [attack, attack])
    ax.set_yticks([1, 2], [attack, attack])
    ax.set_title(attack)
    ax.set_xlabel(attack)
    ax.set_ylabel(attack)
    ax.text(1.5, 1.5, attack)
    ax.annotate(attack, (1, 1))
    ax.legend(title=attack)
    figure.suptitle(attack)


@pytest.mark.parametrize("attack", ATTACKS)
def test_no_text_of_a_figure_is_read_as_mathtext(attack: str) -> None:
    spec = PlotSpec("texts", "every text", ("any",), draw_every_text_kind)
    data = JobData(kind="any", result={"attack": attack}, artifact_names=frozenset(), load_artifact=lambda _: None)
    texts = svg_texts(render(spec, data, "svg"))
    assert sum(text == attack for text in texts) >= 10, texts  # ticks, labels, title, legend, annotations
    assert render(spec, data, "png").startswith(b"\x89PNG")
