"""The report suite is deterministic: a regenerated (reduced) suite writes the identical CSV, and
``check`` notices when a committed CSV differs."""

from __future__ import annotations

from simulator.report import suite


def test_suite_csv_is_deterministic_and_checked(tmp_path, capsys):
    out = suite.generate(tmp_path, suite.QUICK)
    text = (out / "summary.csv").read_text()
    assert {"last_mile_vs_concurrency", "remedies", "dit_strategies", "token_pipeline"} <= {
        line.split(",")[0] for line in text.splitlines()[1:]}
    assert suite.check(out, suite.QUICK) == 0  # a second run, compared line by line
    (out / "summary.csv").write_text(text.replace(",ok", ",oom", 1))
    assert suite.check(out, suite.QUICK) == 1
    assert "differs" in capsys.readouterr().out
