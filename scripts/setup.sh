#!/usr/bin/env bash
# Set up a virtual environment with mirage and its development tools.
# Reuses a PyTorch that is already installed system-wide (e.g. a CUDA build on a GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv --system-site-packages .venv
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  # a CPU build is enough for everything but the GPU tests
  .venv/bin/pip install -q "torch==2.13.0" || .venv/bin/pip install -q torch
fi
.venv/bin/pip install -q -e ".[dev]"
