#!/usr/bin/env bash
# check_replay.sh BINARY RANKS: the outside check of `make check-09` (checks.txt). The run's layouts
# compare the parallel run with the single-device baseline, which runs the same MoE block: a
# mistake in the block itself (the balancing loss's gradient, the dispatch order on one rank) is
# made the same way on both sides and passes them. Here the run on RANKS ranks (8 experts, top-2,
# dropless) dumps 3 steps (--dump, docs/dump-format.md), and tests/reference_torch.py
# rebuilds the model from the definition in PyTorch, float64, autograd and all: the losses within
# 1e-5, the step-1 gradients within 1e-4 of its largest, every tensor.
set -u
bin=$1; np=$2
py=/usr/bin/python3
$py -c "import torch" 2>/dev/null || { echo "FAIL: PyTorch is missing for $py (make deps installs it)"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
$MPIRUN_BASE -np "$np" "$bin" --experts 8 --top-k 2 --batch 8 --steps 3 --dump "$tmp/d" \
    --out "$tmp/o" >"$tmp/run.txt" 2>&1 || { tail -5 "$tmp/run.txt"; echo "FAIL: the run that dumps"; exit 1; }
if ! $py tests/reference_torch.py "$tmp/d" >"$tmp/ref.txt" 2>&1; then
    grep -E "FAIL|beyond" "$tmp/ref.txt" | head -8
    echo "FAIL: PyTorch's replay of the dump disagrees (the MoE block differs from its definition)"
    exit 1
fi
echo "PyTorch replayed the dump of $np ranks: 3 losses within 1e-5, every step-1 gradient within 1e-4"
