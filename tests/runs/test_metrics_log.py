"""baton.runs.metrics_log: a torn last line of metrics.jsonl is skipped with a warning, a
torn line elsewhere is an error naming it; truncate_after cuts back to a step atomically."""

import json
import logging
import os

import pytest

from baton.runs.metrics_log import MetricsLogError, read_metrics, truncate_after


def _lines(*steps):
    return "".join(json.dumps({"step": s, "reward/mean": s / 10}) + "\n" for s in steps)


def test_reads_whole_file_and_run_dir(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(_lines(0, 1, 2) + "\n")  # a blank line is fine
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]
    assert read_metrics(tmp_path / "metrics.jsonl") == read_metrics(tmp_path)
    assert read_metrics(tmp_path / "absent.jsonl") == []


@pytest.mark.parametrize("tail", ['{"step": 3, "reward/me', '{"step": 3', "\0" * 40, '{"step": 3}\n\0\0\0'],
                         ids=["cut-mid-key", "cut-mid-number", "nul-bytes", "nul-after-newline"])
def test_torn_last_line_is_skipped_with_a_warning(tmp_path, caplog, tail):
    p = tmp_path / "metrics.jsonl"
    p.write_text(_lines(0, 1, 2) + tail)
    with caplog.at_level(logging.WARNING, logger="baton.runs"):
        rows = read_metrics(p)
    assert [r["step"] for r in rows] == [0, 1, 2] + ([3] if tail.startswith('{"step": 3}\n') else [])
    assert "torn last line" in caplog.text


def test_complete_last_line_without_newline_is_kept(tmp_path, caplog):
    p = tmp_path / "metrics.jsonl"
    p.write_text(_lines(0, 1) + '{"step": 2}')
    with caplog.at_level(logging.WARNING, logger="baton.runs"):
        assert [r["step"] for r in read_metrics(p)] == [0, 1, 2]
    assert caplog.text == ""


def test_torn_middle_line_is_an_error_naming_it(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text(_lines(0, 1) + '{"step": 2, "rew' + "\n" + _lines(3))  # appended after a torn line
    with pytest.raises(MetricsLogError, match=r"line 3 of 4 .*only a torn last line is skipped"):
        read_metrics(p)
    with pytest.raises(MetricsLogError, match="line 3"):
        truncate_after(p, 1)
    p.write_text(_lines(0) + "[1, 2]\n" + _lines(1))
    with pytest.raises(MetricsLogError, match="line 2 of 3 is not a JSON object"):
        read_metrics(p)


def test_truncate_after_keeps_lines_up_to_the_step_byte_for_byte(tmp_path):
    p = tmp_path / "metrics.jsonl"
    original = _lines(0, 1, 2, 3, 4, 5)
    p.write_text(original + '{"step": 6, "x"')  # a crash mid-append after step 5
    assert truncate_after(tmp_path, 3) == (4, 2)
    assert p.read_text() == _lines(0, 1, 2, 3)
    assert [n for n in os.listdir(tmp_path)] == ["metrics.jsonl"]  # no temp file left
    assert truncate_after(p, 3) == (4, 0) and p.read_text() == _lines(0, 1, 2, 3)
    assert truncate_after(p, 10) == (4, 0)
    assert truncate_after(p, -1) == (0, 4) and p.read_text() == ""
    assert truncate_after(tmp_path / "absent.jsonl", 3) == (0, 0)


def test_truncate_after_repairs_missing_final_newline(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text(_lines(0, 1) + '{"step": 2}')
    assert truncate_after(p, 5) == (3, 0)
    assert p.read_text() == _lines(0, 1) + '{"step": 2}\n'  # the next append starts a new line


def test_truncate_after_needs_a_step_on_every_line(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text(_lines(0) + '{"loss": 1.0}\n' + _lines(1))
    with pytest.raises(MetricsLogError, match="record 2 has no integer 'step'"):
        truncate_after(p, 0)
    assert p.read_text() == _lines(0) + '{"loss": 1.0}\n' + _lines(1)  # untouched


def test_truncate_after_is_atomic(tmp_path, monkeypatch):
    p = tmp_path / "metrics.jsonl"
    p.write_text(_lines(0, 1, 2))
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("EIO")))
    with pytest.raises(OSError, match="EIO"):
        truncate_after(p, 0)
    monkeypatch.undo()
    assert p.read_text() == _lines(0, 1, 2) and os.listdir(tmp_path) == ["metrics.jsonl"]
