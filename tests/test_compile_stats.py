"""tests/compile_stats.py, the plugin that records each test's time and compiles: its report's sums."""

import json

from tests import compile_stats


def test_report_sums_per_device_and_per_file(tmp_path, capsys):
    rows = [
        {"test": "tests/test_a.py::test_x[CL]", "seconds": 3.0, "compiles": [["CL", 1.0], ["CL", 0.5]]},
        {"test": "tests/test_a.py::test_x[CPU]", "seconds": 2.0, "compiles": [["CPU", 0.25]]},
        {"test": "tests/test_b.py::test_y", "seconds": 1.0, "compiles": [["CPU", 0.75]]},
    ]
    (tmp_path / "gw0.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:2]) + "\n")
    (tmp_path / "gw1.jsonl").write_text(json.dumps(rows[2]) + "\n")
    compile_stats.report(str(tmp_path))
    out = capsys.readouterr().out
    assert "3 tests, 6 s of test time" in out
    assert "| CL | 2 | 750 | 2 | 3 |" in out  # 2 compiles, median 750 ms, 1.5 s (rounded), 3 s of tests
    assert "| CPU | 2 | 500 | 1 | 2 |" in out
    assert "| tests/test_a.py | 5 | 2 | CL:2 CPU:1 |" in out
    assert "| tests/test_b.py | 1 | 1 | CPU:1 |" in out


def test_timed_wrapper_records_the_device_and_still_returns_and_raises():
    class Owner:
        @staticmethod
        def build(x):
            if x < 0:
                raise ValueError("negative")
            return x * 2

    compile_stats._compiles.clear()
    compile_stats._timed(Owner, "build", "CL")
    assert Owner.build(3) == 6
    try:
        Owner.build(-1)
    except ValueError:
        pass
    else:
        raise AssertionError("the wrapped function's error was swallowed")
    assert [d for d, _ in compile_stats._compiles] == ["CL", "CL"]
    compile_stats._compiles.clear()
