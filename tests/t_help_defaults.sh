#!/usr/bin/env bash
# t_help_defaults.sh: each Llama chapter's --help prints the defaults its run really uses. The
# defaults are read from `NN --help` and compared with what a run given no model or training flag
# uses: chapters 01-07 and 09 from a --dump at NP=2 (09: its experts' flags too) (the configuration and lr in init.safetensors' metadata,
# the batch from batch_1's shape, the steps from losses.txt); chapter 08, whose 500 default steps
# are too long to run here, from the lines its run prints before step 1 (the run is then stopped).
set -u
root=${BUILD_ROOT:-build}; backend=${BACKEND:-cpu}
mpirun_base="${MPIRUN_BASE:-$(tools/mpirun_base.sh)} --mca odls_base_sigkill_timeout 0"
bin_dir=$(cd "$root/$backend" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
bad=0; n=0
for nn in 01 02 03 04 05 06 07 08 09; do
    n=$((n+1)); d=$tmp/$nn; mkdir -p "$d"
    "$bin_dir/$nn" --help >"$d/help.txt" 2>&1 </dev/null
    if [ "$nn" = 08 ]; then
        (cd "$d" && exec $mpirun_base -np 1 "$bin_dir/08" --out o --sample 0 </dev/null >run.txt 2>&1) &
        pid=$!
        for _ in $(seq 600); do grep -q '^schedule:' "$d/run.txt" 2>/dev/null && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
        kill $pid 2>/dev/null; wait $pid 2>/dev/null
    else
        (cd "$d" && timeout 300 $mpirun_base -np 2 "$bin_dir/$nn" --dump dump --out o </dev/null >run.txt 2>&1)
    fi
    if ! python3 - "$nn" "$d" <<'EOF'
import json, re, struct, sys
nn, d = sys.argv[1], sys.argv[2]
help_text = open(f"{d}/help.txt").read()
def default(flag):
    m = re.search(r"^  --%s \S+ .*\(default ([^;)]+)" % re.escape(flag), help_text, re.M)
    if not m: sys.exit(f"chapter {nn}: --help has no default for --{flag}")
    return m.group(1).strip()
want = {k: default(k) for k in ["dim", "n-layers", "n-heads", "n-kv-heads", "ffn-dim", "vocab", "seq-len",
                                "batch", "steps", "lr", "clip-grad-norm"]}
if want["n-kv-heads"].startswith("n-heads"): want["n-kv-heads"] = want["n-heads"]
want = {k: (0.0 if v == "off" else float(v)) for k, v in want.items()}
got = {}
if nn == "08":
    run = open(f"{d}/run.txt").read()
    m = re.search(r"^model: dim (\d+), (\d+) layers, (\d+) heads \((\d+) kv\), ffn (\d+), vocab (\d+)", run, re.M)
    b = re.search(r"batch (\d+) x (\d+) tokens", run)
    s = re.search(r"^schedule: lr (\S+), .* at step (\d+); AdamW, clip (\S+)", run, re.M)
    if not (m and b and s): sys.exit(f"chapter 08: the run did not print its settings:\n{run[-2000:]}")
    for k, v in zip(["dim", "n-layers", "n-heads", "n-kv-heads", "ffn-dim", "vocab"], m.groups()): got[k] = float(v)
    got["batch"], got["seq-len"] = float(b.group(1)), float(b.group(2))
    got["lr"], got["steps"], got["clip-grad-norm"] = float(s.group(1)), float(s.group(2)), float(s.group(3))
else:
    def header(path):
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            return json.loads(f.read(n))
    try:
        meta = header(f"{d}/dump/init.safetensors")["__metadata__"]
        tokens = header(f"{d}/dump/batch_1.safetensors")["tokens"]["shape"]
        steps = sum(1 for line in open(f"{d}/dump/losses.txt") if line.strip())
    except OSError as e:
        sys.exit(f"chapter {nn}: the run left no dump ({e}):\n" + open(f"{d}/run.txt").read()[-2000:])
    for k, key in [("dim", "dim"), ("n-layers", "n_layers"), ("n-heads", "n_heads"), ("n-kv-heads", "n_kv_heads"),
                   ("ffn-dim", "ffn_dim"), ("vocab", "vocab_size"), ("seq-len", "seq_len"), ("lr", "lr")]:
        got[k] = float(meta[key])
    got["clip-grad-norm"] = float(meta.get("clip_grad_norm", 0))
    got["batch"], got["steps"] = float(tokens[0]), float(steps)
    if nn == "09":   # the experts' sizes, from the dump's metadata too
        for k, key in [("experts", "experts"), ("top-k", "top_k"), ("expert-dim", "expert_dim"), ("aux-alpha", "aux_alpha")]:
            want[k], got[k] = float(default(k)), float(meta[key])
wrong = [f"--{k}: help {want[k]:g}, run {got[k]:g}" for k in want if abs(want[k] - got[k]) > 1e-6 * max(1, abs(got[k]))]
if wrong: sys.exit(f"chapter {nn}: --help's defaults differ from the run's: " + "; ".join(wrong))
EOF
    then bad=$((bad+1)); fi
done
echo "$((n-bad)) of $n chapters' --help show the defaults their runs use"
[ $bad -eq 0 ]
