#!/usr/bin/env bash
# t_checkpoint_crash.sh: a save that dies before its rename leaves the previous checkpoint
# loadable (chapter 08's checkpoint.c). Through tests/test_checkpoint's modes, on 4 ranks:
#   1. --save DIR 1                                    step 1 saved: DIR/latest = step_00000001
#   2. CKPT_TEST_CRASH_BEFORE_RENAME=1 --save DIR 2    every rank exits with status 3 after
#      writing everything into DIR/step_00000002.tmp.<pid>: no DIR/step_00000002, latest unchanged
#   3. --verify DIR 1                                  a tp-4 model loads DIR: step 1, bit for bit
#   4. --save DIR 2, --verify DIR 2                    the next save removes the leftover and lands
#   5. --export DIR FILE                               step 2 loaded on tp 4 and exported as one
#      safetensors file: PyTorch (tests/reference_torch.py, float64) reads it with the baseline's
#      names and shapes, and its loss on the next batch agrees with the C model's to 1e-5
set -u
root=${BUILD_ROOT:-build}; backend=${BACKEND:-cpu}
mpirun_base=${MPIRUN_BASE:-$(tools/mpirun_base.sh)}
bin=$root/$backend/tests/test_checkpoint
[ -x "$bin" ] || { echo "no $bin: build first (make BACKEND=$backend)"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
dir=$tmp/ckpt
n=0; bad=0

# expect 'what' WANT_RC [env...] -- args: one run of the test binary on 4 ranks
expect() {
    local what=$1 want=$2; shift 2
    timeout 120 $mpirun_base -np 4 "$@" </dev/null >"$tmp/out" 2>&1
    local rc=$?
    n=$((n+1))
    if [ $rc -ne "$want" ]; then
        echo "FAIL $what: exit $rc, want $want"; sed 's/^/  | /' "$tmp/out" | tail -8; bad=$((bad+1))
    else echo "ok   $what (exit $rc)"; fi
}
# check 'what' CONDITION...: a condition on the directory
check() {
    local what=$1; shift
    n=$((n+1))
    if "$@"; then echo "ok   $what"; else echo "FAIL $what"; ls -R "$dir" | sed 's/^/  | /' | head -20; bad=$((bad+1)); fi
}
latest_is() { [ "$(cat "$dir/latest" 2>/dev/null)" = "$1" ]; }
leftovers() { ls -d "$dir"/step_00000002.tmp.* 2>/dev/null | wc -l; }

expect "save step 1" 0 "$bin" --save "$dir" 1
check "latest names step_00000001" latest_is step_00000001
expect "save step 2 crashing before the rename" 3 -x CKPT_TEST_CRASH_BEFORE_RENAME=1 "$bin" --save "$dir" 2
check "no step_00000002 after the crash" test ! -e "$dir/step_00000002"
check "latest still names step_00000001" latest_is step_00000001
check "the crashed save had written everything (index.json in its temporary directory)" \
    bash -c "ls $dir/step_00000002.tmp.*/index.json >/dev/null 2>&1"
expect "step 1 loads after the crash, bit for bit (tp 4)" 0 "$bin" --verify "$dir" 1
expect "save step 2 again" 0 "$bin" --save "$dir" 2
check "latest names step_00000002" latest_is step_00000002
check "the crashed save's leftover is gone" test "$(leftovers)" -eq 0
expect "step 2 loads, bit for bit (tp 4)" 0 "$bin" --verify "$dir" 2

# 5. the export, read by PyTorch
py=/usr/bin/python3
n=$((n+1))
if ! $py -c "import torch" 2>/dev/null; then
    echo "FAIL the export in PyTorch: PyTorch is missing for $py: run make deps"; bad=$((bad+1))
elif ! timeout 120 $mpirun_base -np 4 "$bin" --export "$dir" "$tmp/final.safetensors" </dev/null >"$tmp/out" 2>&1; then
    echo "FAIL the export in PyTorch: the export failed"; sed 's/^/  | /' "$tmp/out" | tail -8; bad=$((bad+1))
else
    c_loss=$(sed -n 's/^loss //p' "$tmp/out")
    if PYTHONPATH=tests $py - "$tmp/final.safetensors" "$c_loss" >"$tmp/py" 2>&1 <<'PY'
import sys, numpy as np, torch
import reference_torch as ref
path, c_loss = sys.argv[1], float(sys.argv[2])
params, meta = ref.read_safetensors(path)
config = {k: float(v) if k in ("norm_eps", "rope_theta") else int(v) for k, v in meta.items() if k != "format"}
ref.check_tensors(params, config, path)                  # the baseline's names and shapes, nothing else
batch, _ = ref.read_safetensors(path + ".batch")
p = {k: torch.tensor(v, dtype=ref.DTYPE) for k, v in params.items()}
tokens, targets = (torch.from_numpy(batch[k].astype(np.int64)) for k in ("tokens", "targets"))
loss = ref.mean_loss(ref.forward(p, config, tokens), targets).item()
ok = abs(loss - c_loss) <= ref.LOSS_RTOL * max(1.0, abs(loss))
print(f"loss: C {c_loss:.9g}, PyTorch {loss:.9g}, |diff| {abs(loss - c_loss):.3e}")
sys.exit(0 if ok else 1)
PY
    then echo "ok   the export in PyTorch: $(cat "$tmp/py")"
    else echo "FAIL the export in PyTorch"; sed 's/^/  | /' "$tmp/py" | tail -8; bad=$((bad+1)); fi
fi

echo "$((n-bad)) of $n checks of a save interrupted before its rename, and of the export in PyTorch"
[ $bad -eq 0 ]
