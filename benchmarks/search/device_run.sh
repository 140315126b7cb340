#!/usr/bin/env bash
# The µGraph search measurements on a many-core CPU machine without network, in one run:
#
#   bash benchmarks/search/device_run.sh OUT_DIR
#
# 1. the six rediscoveries (benchmarks/search/rediscover.py: the same configs and restrictions as
#    benchmarks/results/search_rediscover.json) with every worker;
# 2. Table 5 (mirage/generator/ablation.py): rows 5 and 6 without abstract-expression pruning
#    under a short cap, then rows 5, 6, ... 11 with every rule, each capped by the time left.
#
# Everything fits in MIRAGE_DEVICE_BUDGET_S seconds (default 540, 9 minutes) from the start of
# the script.  MIRAGE_DEVICE_SCALE (default 1) scales every budget and cap, for a quick check of
# the script itself (0.1: about a minute).  MIRAGE_DEVICE_WORKERS: worker processes (default: the
# CPUs this process may use, at most 16).  What runs: MIRAGE_DEVICE_CASES (default the six;
# empty: none), MIRAGE_DEVICE_SHORT_OPS (rows without abstract expressions, default "5 6"),
# MIRAGE_DEVICE_OPS (rows with every rule, default "5 6 7 8 9 10 11"); e.g. a second run with
# MIRAGE_DEVICE_CASES= MIRAGE_DEVICE_SHORT_OPS= MIRAGE_DEVICE_OPS="10" gives row 10 the whole budget.
# Five files land in OUT_DIR: search_rediscover.json, search_cases.tar.gz (search_<case>.json of
# each case), table5.json, device_run.log, machine.txt.
#
# Python packages the machine lacks (egglog and what importing it needs) travel as wheels in .whl/
# at the repository root; the script installs them into /tmp/site when `import egglog` fails.
# To fill .whl/ here (with network; the versions of .venv, for CPython 3.12 on x86-64 Linux):
#
#   bash benchmarks/search/device_run.sh --wheels
#
# egglog's wheel holds a 210 MiB native library, most of it debug symbols: --wheels strips them
# (`strip --strip-unneeded`, 11 MiB) and repacks the wheel with build tag 1 and a new RECORD.
# galois is not needed: the search uses the default fields, which need no field construction.
set -euo pipefail
cd "$(dirname "$0")/../.."

WHEELS=(egglog black graphviz opentelemetry-api platformdirs pytokens pathspec)

fetch_wheels() {
    local python=.venv/bin/python versions=()
    for name in "${WHEELS[@]}"; do
        versions+=("$name==$("$python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")")
    done
    mkdir -p .whl
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "${versions[@]}"
    local wheel
    for wheel in .whl/egglog-*-cp312-cp312-*.whl; do
        case "$(basename "$wheel")" in egglog-*-1-cp312-*) continue ;; esac
        "$python" - "$wheel" <<'PYTHON'
"""Strip the debug symbols of the wheel's native libraries; write it back with build tag 1."""
import base64, hashlib, pathlib, subprocess, sys, tempfile, zipfile

source = pathlib.Path(sys.argv[1])
name, version, rest = source.name.split("-", 2)
target = source.with_name(f"{name}-{version}-1-{rest}")
with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(source) as wheel:
    wheel.extractall(tmp)
    root = pathlib.Path(tmp)
    for library in root.rglob("*.so"):
        subprocess.run(["strip", "--strip-unneeded", str(library)], check=True)
    (record,) = root.glob("*.dist-info/RECORD")
    lines = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p != record):
        data = path.read_bytes()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{path.relative_to(root).as_posix()},sha256={digest},{len(data)}")
    lines.append(f"{record.relative_to(root).as_posix()},,")
    record.write_text("\n".join(lines) + "\n")
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as out:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            out.write(path, path.relative_to(root).as_posix())
print(f"{target.name}: {target.stat().st_size / 2**20:.1f} MiB (was {source.stat().st_size / 2**20:.1f})")
PYTHON
        rm "$wheel"
    done
    du -sh .whl
}

if [[ "${1:-}" == "--wheels" ]]; then
    fetch_wheels
    exit 0
fi

OUT=${1:?usage: device_run.sh OUT_DIR   (or --wheels, here, to fill .whl/)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
START=$(date +%s)
SCALE=${MIRAGE_DEVICE_SCALE:-1}
BUDGET=$(python3 -c "print(int(float('${MIRAGE_DEVICE_BUDGET_S:-540}') * float('$SCALE')))")
WORKERS=${MIRAGE_DEVICE_WORKERS:-$(python3 -c "import os; print(min(16, len(os.sched_getaffinity(0))))")}
LOG="$OUT/device_run.log"

seconds() { python3 -c "print(max(1, round(float('$1') * float('$SCALE'))))"; }
left() { echo $((BUDGET - ($(date +%s) - START))); }
say() { echo "[device_run $(($(date +%s) - START)) s] $*" | tee -a "$LOG"; }

if ! python3 -c "import egglog, tqdm, numpy" 2>/dev/null; then
    say "installing the wheels of .whl/ into /tmp/site"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
{ uname -a; python3 --version; nproc; echo "workers: $WORKERS"; } >"$OUT/machine.txt"
say "budget ${BUDGET} s, ${WORKERS} workers, scale ${SCALE}"

# What comes back from such a machine is limited to a few files: the per-case statistics travel as
# one archive, search_cases.tar.gz.
CASES=${MIRAGE_DEVICE_CASES-rmsnorm_b1 gatedmlp_m1 lora_m16 ntrans_b1 gqa_b1 qknorm_b1}
SHORT_OPS=${MIRAGE_DEVICE_SHORT_OPS-5 6}
OPS=${MIRAGE_DEVICE_OPS-5 6 7 8 9 10 11}
say "cases: ${CASES:-none}; table 5 rows without abstract expressions: ${SHORT_OPS:-none}; all rules: ${OPS:-none}"

# 1. The rediscoveries, each stopping when it finds the hand-built structure.
if [[ -n "$CASES" ]]; then
    say "rediscoveries"
    CASE_DIR=$(mktemp -d)
    # shellcheck disable=SC2086  # the case names are words
    python3 -m benchmarks.search.rediscover --cases $CASES --time "$(seconds 60)" --workers "$WORKERS" \
        --out "$CASE_DIR/search_rediscover.json" >>"$LOG" 2>&1 || say "rediscover failed (exit $?)"
    cp "$CASE_DIR/search_rediscover.json" "$OUT/" 2>/dev/null || true
    tar -czf "$OUT/search_cases.tar.gz" -C "$CASE_DIR" . && rm -rf "$CASE_DIR"
fi

# 2. Table 5: without abstract-expression pruning under a short cap, then every rule while time is left.
table5() {  # OPS MODE CAP
    python3 -m mirage.generator.ablation --ops "$1" --modes "$2" --cap "$3" --workers "$WORKERS" \
        --out "$OUT/table5.json" --append >>"$LOG" 2>&1 || say "table 5 row $1 ($2) failed (exit $?)"
}
SHORT=$(seconds 30)
for ops in $SHORT_OPS; do
    if (($(left) > SHORT + 30)); then
        say "table 5: $ops block ops, no abstract expressions, cap ${SHORT} s"
        table5 "$ops" "no abstract expressions" "$SHORT"
    fi
done
for ops in $OPS; do
    cap=$(($(left) - 30))
    if ((cap < $(seconds 15))); then
        say "no time left for $ops block ops and more"
        break
    fi
    say "table 5: $ops block ops, all rules, cap ${cap} s"
    table5 "$ops" "all rules" "$cap"
done
say "done"
