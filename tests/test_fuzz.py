"""Issue 9's fuzz test in the default suite: generated bad inputs through the API and the CLI.

The generator and the checks live in tests/fuzz_inputs.py; benchmarks/fuzz.py runs the same
checks over >= 1,000 inputs. Here: a hypothesis-driven sample through ``simulator.run`` (in one
long-lived worker process, so a hang or a memory blow-up is contained and timed), two inputs of
every attack class through ``lastmile run``, and the ``--out`` safety rules.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_inputs as fz  # noqa: E402

API_POPULATION = [c for c in fz.generate(700, seed=0) if c.api]
CLI_CASES = fz.one_per_class(seed=0, per_class=2)


@pytest.fixture(scope="module")
def api_worker():
    with fz.ApiWorker() as w:
        yield w


def test_generator_is_deterministic_and_covers_every_class():
    a, b = fz.generate(200, seed=3), fz.generate(200, seed=3)
    assert [c.ident for c in a] == [c.ident for c in b]
    assert [c.ident for c in a] != [c.ident for c in fz.generate(200, seed=4)]
    assert {c.cls for c in a} == set(fz.CLASSES)
    assert all(c.accept for c in a), "every case names what its error message must mention"


def test_unmutated_bases_are_valid(tmp_path):
    """The mutations, not the bases, are what make the inputs bad: every shrunk base loads."""
    import simulator

    for i, base in enumerate(fz.load_bases()):
        d = tmp_path / f"b{i}"
        d.mkdir()
        for name, data in base.files.items():
            (d / name).write_bytes(data)
        (d / "scenario.yaml").write_bytes(fz.dump(base.raw))
        simulator.load_scenario(d / "scenario.yaml")


@settings(derandomize=True, max_examples=150, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=st.sampled_from(API_POPULATION))
def test_api_rejects_bad_input_with_one_line_naming_the_key(api_worker, tmp_path_factory, case):
    outcome = api_worker.check(case, tmp_path_factory.mktemp("api"))
    assert outcome.ok, (f"[{case.cls}] {case.desc} (base {case.base}): {'; '.join(outcome.causes)}\n"
                        f"{outcome.command}\n{outcome.output}")


@pytest.mark.parametrize("case", CLI_CASES, ids=[f"{c.cls}-{c.key}" for c in CLI_CASES])
def test_cli_rejects_bad_input_with_one_line_exit_2(tmp_path, case):
    outcome = fz.check_cli(case, tmp_path)
    assert outcome.ok, (f"[{case.cls}] {case.desc} (base {case.base}): {'; '.join(outcome.causes)}\n"
                        f"$ {outcome.command}\n{outcome.output}")


# ---- --out never deletes what the CLI did not write ---------------------------------------------


def _lastmile(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*fz.LASTMILE_ARGV, "run", "--set", "workload.requests=5", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60, env=fz._env())


def _user_files(root: Path) -> None:
    (root / "sub").mkdir(parents=True, exist_ok=True)
    (root / "thesis.tex").write_text("years of work\n")
    (root / "sub" / "data.bin").write_bytes(bytes(range(256)))


def test_out_non_empty_folder_of_unrelated_files_is_refused_and_untouched(tmp_path):
    keep = tmp_path / "keep"
    _user_files(keep)
    before = fz.snapshot(tmp_path)
    r = _lastmile(tmp_path, "--out", "keep")
    assert fz.snapshot(tmp_path) == before
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("lastmile: error:"), r.stderr
    assert "Traceback" not in r.stderr


def test_out_dot_never_empties_the_current_folder(tmp_path):
    _user_files(tmp_path)
    before = fz.snapshot(tmp_path)
    r = _lastmile(tmp_path, "--out", ".")
    assert fz.snapshot(tmp_path) == before, r.stderr
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr


def test_out_fresh_folder_is_written_and_a_previous_run_folder_can_be_rewritten(tmp_path):
    for attempt in range(2):
        r = _lastmile(tmp_path, "--out", "run1")
        assert r.returncode == 0, f"attempt {attempt}: {r.stderr}"
        assert (tmp_path / "run1" / "summary.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run1"]


def test_name_with_dots_writes_its_folder_under_runs(tmp_path):
    cwd = tmp_path / "a" / "b"
    cwd.mkdir(parents=True)
    (cwd / "s.yaml").write_text("name: ../../escaped\nworkload: {requests: 5}\n")
    r = subprocess.run([*fz.LASTMILE_ARGV, "run", "s.yaml"], cwd=cwd, capture_output=True, text=True,
                       timeout=60, env=fz._env())
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b"]
    runs = list((cwd / "runs").iterdir())
    assert len(runs) == 1 and runs[0].is_dir() and (runs[0] / "summary.json").is_file()
    assert runs[0].resolve().parent == (cwd / "runs").resolve()


# ---- the checks themselves can fail --------------------------------------------------------------


def test_checks_flag_a_valid_input_and_a_message_that_names_another_key(api_worker, tmp_path):
    base = next(b for b in fz.load_bases() if b.is_default)
    valid = fz.Case(cls="numeric", desc="control: the unmutated default", key="seed", base=base.name,
                    accept=("seed",), scenario=base.raw)
    outcome = api_worker.check(valid, tmp_path)
    assert not outcome.ok and any(c.startswith("accepted") for c in outcome.causes), outcome.causes
    assert fz.names_key("x.yaml: serving.max_batch: too big", ("serving.max_batch", "max_batch"))
    assert not fz.names_key("x.yaml: serving.max_batched_tokens: too big", ("max_batch",))
    assert "key not named" in fz.check_error_line("lastmile: error: x.yaml: seed: bad", valid.__class__(
        cls="numeric", desc="", key="slo.itl", base="", accept=("slo.itl", "itl")), prefix="lastmile: error:")
    assert any(c.startswith("traceback") for c in fz.check_error_line(
        "Traceback (most recent call last):\nValueError: x\n", valid, prefix="lastmile: error:"))
