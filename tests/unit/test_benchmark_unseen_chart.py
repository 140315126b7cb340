"""``python -m benchmarks.unseen_chart``: the last record holding a program wins, programs come in the
order asked, a program no record holds and an unreadable record get errors that name them, and the
chart is a PNG of one group of bars a program."""

import json

import pytest

from benchmarks.unseen_chart import latest_rows, main


def _record(date: str, rows: list[tuple[str, float]]) -> dict:
    return {"facts": {"device": "GPU", "date": date},
            "rows": [{"program": p, "mirage_us": us, "eager_us": 2 * us, "sdpa_us": None} for p, us in rows]}


def test_the_last_record_holding_a_program_wins_in_the_order_asked():
    first, second = _record("d1", [("a", 1.0), ("b", 2.0)]), _record("d2", [("a", 3.0)])
    rows = latest_rows([first, second], ["b", "a"])
    assert [(r["program"], r["mirage_us"]) for r in rows] == [("b", 2.0), ("a", 3.0)]
    assert [r["program"] for r in latest_rows([first, second])] == ["a", "b"]
    with pytest.raises(ValueError, match="no record holds c"):
        latest_rows([first], ["a", "c"])


def test_the_chart_is_written_and_bad_records_are_named(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_record("d1", [("a", 1.0), ("b", 2.5)])))
    out = tmp_path / "chart.png"
    main([str(path), "--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "2 programs" in capsys.readouterr().out
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(SystemExit):
        main([str(broken), "--out", str(out)])
    assert "broken.json: not a readable benchmarks.unseen record" in capsys.readouterr().err
