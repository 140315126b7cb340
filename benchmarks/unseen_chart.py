"""A bar chart of programs of no test (``python -m benchmarks.unseen`` records): each program's time
through ``mi.superoptimize`` beside PyTorch's own fused kernel (SDPA, where the program has one),
``torch.compile`` (where the record timed it: ``--compile``) and the program as written (eager), µs a
call. Where several records hold a program, the last one
given wins.

    python -m benchmarks.unseen_chart benchmarks/results/unseen_h200_2026-11-30_*.json \\
        --out benchmarks/results/unseen_h200_2026-11-30_token_counts.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# what each bar shows: (label, the record's field)
BARS = (("mirage", "mirage_us"), ("SDPA", "sdpa_us"), ("torch.compile", "torch_compile_us"),
        ("eager (as written)", "eager_us"))


def latest_rows(records: list[dict], programs: list[str] | None = None) -> list[dict]:
    """One row per program, the last record's where several hold it, in ``programs``' order (else in
    the order first seen); raises ValueError naming a program that no record holds."""
    rows: dict[str, dict] = {}
    for record in records:
        for row in record["rows"]:
            rows[row["program"]] = row
    missing = [p for p in programs or () if p not in rows]
    if missing:
        raise ValueError(f"no record holds {', '.join(missing)}; records hold {', '.join(rows)}")
    return [rows[p] for p in programs] if programs else list(rows.values())


def draw(rows: list[dict], facts: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(rows) + 2), 4.5))
    shown = [(label, field) for label, field in BARS if any(r.get(field) is not None for r in rows)]
    width = 0.8 / len(shown)  # a series no program has (SDPA) takes no slot, colour or legend entry
    for k, (label, field) in enumerate(shown):
        xs = [i + k * width for i, r in enumerate(rows) if r.get(field) is not None]
        values = [r[field] for r in rows if r.get(field) is not None]
        bars = ax.bar(xs, values, width, label=label)
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], [r["program"] for r in rows],
                  rotation=25, ha="right")
    ax.set_ylabel("µs per call (median, CUDA-graph replays)")
    ax.legend(fontsize=8)
    ax.set_title(f"programs of no test — {facts.get('device', '?')}, {facts.get('date', '?')}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+", metavar="JSON", help="benchmarks.unseen records")
    parser.add_argument("--programs", default="", help="only these programs, in this order (comma-separated)")
    parser.add_argument("--out", required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    records = []
    for name in args.records:
        try:
            records.append(json.loads(Path(name).read_text()))
        except (OSError, json.JSONDecodeError) as error:
            parser.error(f"{name}: not a readable benchmarks.unseen record ({error})")
    try:
        rows = latest_rows(records, [p for p in args.programs.split(",") if p] or None)
    except ValueError as error:
        parser.error(str(error))
    draw(rows, records[-1].get("facts", {}), Path(args.out))
    print(f"wrote {args.out} ({len(rows)} programs)")


if __name__ == "__main__":
    main()
