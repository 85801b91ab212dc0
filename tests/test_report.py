"""The report suite is deterministic: a regenerated (reduced) suite writes the identical CSV, and
``check`` notices when a committed CSV differs."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.report import suite


@pytest.mark.slow
def test_suite_csv_is_deterministic_and_checked(tmp_path, capsys, monkeypatch):
    out = suite.generate(tmp_path, suite.QUICK)
    text = (out / "summary.csv").read_text()
    assert {"last_mile_vs_concurrency", "remedies", "dit_strategies", "token_pipeline"} <= {
        line.split(",")[0] for line in text.splitlines()[1:]}
    assert suite.check(out, suite.QUICK) == 0  # a second run, compared line by line
    # a committed file that differs is caught (the regeneration stands in: the same text as above)
    monkeypatch.setattr(suite, "generate", lambda tmp, scale: (Path(tmp) / "summary.csv").write_text(text))
    (out / "summary.csv").write_text(text.replace(",ok", ",oom", 1))
    assert suite.check(out, suite.QUICK) == 1
    assert "differs" in capsys.readouterr().out


def test_coinciding_series_stay_distinguishable():
    from simulator.report import plots

    names = ["DiT · uniform", "DiT · balanced", "LLM · uniform", "LLM · balanced"]
    st = plots.series_styles(names)
    # same workload: same colour and marker, different line style and fill, drawn on top
    assert st["DiT · uniform"]["color"] == st["DiT · balanced"]["color"] != st["LLM · uniform"]["color"]
    assert st["DiT · uniform"]["ls"] != st["DiT · balanced"]["ls"]
    assert st["DiT · uniform"]["mfc"] != st["DiT · balanced"]["mfc"]
    assert st["DiT · balanced"]["zorder"] > st["DiT · uniform"]["zorder"]


def test_log_axes_label_enough_values_but_never_crowd():
    import matplotlib.pyplot as plt
    import numpy as np

    from simulator.report import plots

    def labels(lo, hi):
        fig, ax = plt.subplots()
        ax.set_yscale("log")
        ax.plot([0, 1], [lo, hi])
        plots._log_labels(ax.yaxis)
        fig.canvas.draw()
        lo_v, hi_v = ax.get_ylim()
        ticks = [t for t in ax.yaxis.get_majorticklocs().tolist() + ax.yaxis.get_minorticklocs().tolist()
                 if lo_v <= t <= hi_v]
        fmt_major, fmt_minor = ax.yaxis.get_major_formatter(), ax.yaxis.get_minor_formatter()
        out = sorted({t for t in ticks if fmt_major(t) or fmt_minor(t)})
        plt.close(fig)
        return out

    narrow = labels(0.7, 2.1)  # image latencies: more than the two labels 1 and 2
    assert len(narrow) >= 3 and np.isclose(narrow, 0.8).any() and np.isclose(narrow, 2).any()
    wide = labels(0.03, 200)  # inter-token gaps over four decades: powers of ten only
    assert np.allclose(wide, [0.1, 1, 10, 100])


def test_the_headline_says_why_attribution_and_counterfactual_disagree():
    """Apart by more than 5 points, the sentence names the reason the figures show; close, it says nothing."""
    from simulator.report.suite import _disagreement

    row = {"itl_last_mile_share": 0.81, "last_mile_cost.itl_share": -0.07, "last_mile_cost.throughput_gain": 0.59}
    assert "larger batches" in _disagreement(row) and "-7.0% of ITL saved" in _disagreement(row)
    assert _disagreement({**row, "last_mile_cost.itl_share": 0.79}) == ""
    assert "changes what else waits" in _disagreement({**row, "last_mile_cost.throughput_gain": 0.0})
