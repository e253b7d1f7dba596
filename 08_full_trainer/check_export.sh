#!/usr/bin/env bash
# check_export.sh BINARY RANKS: train a few steps on RANKS ranks (dp_shard 2 x cp 2 x tp 2 at 8),
# --export one safetensors, and let PyTorch (check_export.py) compute the validation loss of the
# exported weights: it must equal the trainer's printed one (1e-5 relative).
set -u
bin=$1; np=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
case $np in 8) mesh="--dp-shard 2 --cp 2 --tp 2";; 4) mesh="--cp 2 --tp 2 --dp-shard 1";; *) mesh="--dp-shard -1";; esac
data=08_full_trainer/data/tinyshakespeare.txt
$MPIRUN_BASE -np "$np" "$bin" --out "$tmp/out" --dim 64 --n-layers 2 --seq-len 32 --batch 8 --steps 4 \
    --eval-every 4 --eval-batches 3 --data "$data" $mesh --export "$tmp/model.safetensors" >"$tmp/run.txt" 2>&1 ||
    { tail -5 "$tmp/run.txt"; echo "FAIL: the run"; exit 1; }
val=$(sed -n 's/^validation loss \([0-9.]*\);.*/\1/p' "$tmp/run.txt")
[ -n "$val" ] || { tail -5 "$tmp/run.txt"; echo "FAIL: no validation loss printed"; exit 1; }
# (the printed loss has 4 decimals: compare with the CSV's 9 significant digits instead)
val=$(tail -1 "$tmp/out/metrics.csv" | cut -d, -f3)
/usr/bin/python3 08_full_trainer/check_export.py "$tmp/model.safetensors" "$data" 8 3 "$val"
