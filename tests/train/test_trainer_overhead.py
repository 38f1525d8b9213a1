"""benchmarks/trainer_overhead.py runs `recserve train`'s code and reports a step's time and Python calls."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "trainer_overhead.py"


def test_the_overhead_benchmark_times_one_epoch_and_counts_the_calls_of_the_next(string_data_dir, tmp_path):
    out = tmp_path / "overhead.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--data", str(string_data_dir), "--repeats", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert len(report["repeats"]) == 2 and report["settings"]["batch_size"] == 8
    calls = [r["python_calls_a_step"] for r in report["repeats"]]
    assert min(calls) > 500 and abs(calls[0] - calls[1]) <= 0.01 * calls[0]  # unlike the time, steady run to run
    assert all(r["ms_a_step"] > 0 for r in report["repeats"]) and "median" in result.stdout
