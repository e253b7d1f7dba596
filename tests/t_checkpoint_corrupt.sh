#!/usr/bin/env bash
# t_checkpoint_corrupt.sh: chapter 08 refuses a checkpoint that is not whole (checkpoint.c's
# integrity checks) and stops on a non-finite loss. One small run on 2 ranks (FSDP: every tensor
# in two shards, one per rank file) saves steps 2 and 3; each case corrupts a copy of step 2's
# checkpoint and resumes from it on the same mesh. Each refusal must be one line naming what is
# wrong, exit status 2, and the copy left exactly as the case made it:
#   truncated rank file, one flipped bit, two same-size tensors with swapped data offsets (in a
#   rank file's header, and in the index), the index mapping the shards to the wrong files, the
#   wrong step in the index, a missing piece, NaN in a tensor (checksums made to fit), an index of
#   version 1 (no checksums), --data of the same size but another text, another --lr.
# Then: a resume from the final checkpoint is exit 0 with one line; a checkpoint whose values are
# finite but overflow the forward (output.weight = 3e38, checksums fitting) stops the resumed run
# at step 3 with exit status 4 and one line, the checkpoint directory unchanged.
set -u
root=${BUILD_ROOT:-build}; backend=${BACKEND:-cpu}
mpirun_base=${MPIRUN_BASE:-$(tools/mpirun_base.sh)}
bin=$root/$backend/08
[ -x "$bin" ] || { echo "no $bin: build first (make BACKEND=$backend)"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
small="--dp-shard 2 --dim 64 --n-layers 1 --seq-len 32 --batch 4 --steps 3 --eval-every 0"
n=0; bad=0

run08() {   # run08 OUT FLAGS...: 2 ranks, stdout and stderr in $tmp/OUT.txt, status returned
    local out=$1; shift
    timeout 120 $mpirun_base -np 2 "$bin" --out "$tmp/out_$out" $small "$@" </dev/null >"$tmp/$out.txt" 2>&1
}
tree() { (cd "$1" && find . -type f ! -name '*lock*' | sort | xargs sha256sum); }

if ! run08 base --ckpt-dir "$tmp/base" --ckpt-every 2; then
    echo "FAIL the run that saves the checkpoints"; tail -5 "$tmp/base.txt"; exit 1
fi
s2=step_00000002

# corrupt NAME PYTHON: a copy of step 2's checkpoint ($tmp/NAME, latest naming step 2), edited by
# the Python code (c: the step directory; helpers below)
corrupt() {
    local name=$1 code=$2 d=$tmp/$1
    mkdir -p "$d"; cp -r "$tmp/base/$s2" "$d/"; echo $s2 >"$d/latest"
    /usr/bin/python3 - "$d/$s2" <<EOF || { echo "FAIL $name: the corruption itself failed"; bad=$((bad+1)); }
import json, struct, sys, zlib
c = sys.argv[1]
def index(): return json.load(open(c + "/index.json"))
def save_index(x): json.dump(x, open(c + "/index.json", "w"), indent=1)
def header(f):
    b = open(c + "/" + f, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
    return b, n, json.loads(b[8:8 + n])
def refit(f):   # the index's size and crc32 of file f made to fit its bytes
    x = index(); b = open(c + "/" + f, "rb").read()
    for e in x["files"]:
        if e["file"] == f: e["bytes"] = len(b); e["crc32"] = "%08x" % zlib.crc32(b)
    save_index(x)
def fill(f, tensor, value):   # every float of tensor in file f set to value
    b, n, h = header(f); b = bytearray(b); lo, hi = h[tensor]["data_offsets"]
    b[8 + n + lo:8 + n + hi] = struct.pack("<f", value) * ((hi - lo) // 4)
    open(c + "/" + f, "wb").write(b)
$code
EOF
}

# refused NAME 'WORDS' FLAGS...: resume from $tmp/NAME: one line holding WORDS (a grep -E
# pattern), exit status 2, the directory unchanged
refused() {
    local name=$1 words=$2; shift 2
    local before; before=$(tree "$tmp/$name")
    run08 "$name" --ckpt-dir "$tmp/$name" --resume "$@"
    local rc=$? lines; lines=$(wc -l <"$tmp/$name.txt")
    n=$((n+1))
    if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -qE "$words" "$tmp/$name.txt" && [ "$before" = "$(tree "$tmp/$name")" ]; then
        echo "ok   $name: $(cut -c1-240 "$tmp/$name.txt")"
    else
        echo "FAIL $name: exit $rc (want 2), $lines lines (want 1), want /$words/, directory $( [ "$before" = "$(tree "$tmp/$name")" ] && echo unchanged || echo CHANGED)"
        sed 's/^/  | /' "$tmp/$name.txt" | head -8; bad=$((bad+1))
    fi
}

corrupt truncated 'import os; f = c + "/rank_00001.safetensors"; os.truncate(f, os.path.getsize(f) - 100)'
refused truncated 'rank_00001\.safetensors is [0-9]+ bytes, the index says'

corrupt flipped_bit 'b = bytearray(open(c + "/rank_00000.safetensors", "rb").read()); b[len(b) // 2] ^= 0x10; open(c + "/rank_00000.safetensors", "wb").write(b)'
refused flipped_bit 'rank_00000\.safetensors has crc32 [0-9a-f]{8}, the index says'

# two tensors of one size in rank 0's file (norm weights: [64] each) trade their data offsets
corrupt swapped_in_file '
b, n, h = header("rank_00000.safetensors")
a, z = "layers.0.attention_norm.weight/value", "layers.0.ffn_norm.weight/value"
h[a]["data_offsets"], h[z]["data_offsets"] = h[z]["data_offsets"], h[a]["data_offsets"]
t = json.dumps(h, separators=(",", ":")).encode(); t += b" " * (n - len(t))
assert len(t) == n
open(c + "/rank_00000.safetensors", "wb").write(b[:8] + t + b[8 + n:])'
refused swapped_in_file 'rank_00000\.safetensors has crc32'

# the index: the two shards of wq (same size) trade their offsets
corrupt swapped_in_index '
x = index(); p = x["tensors"]["layers.0.attention.wq.weight"]["value"]
p[0]["offsets"], p[1]["offsets"] = p[1]["offsets"], p[0]["offsets"]; save_index(x)'
refused swapped_in_index 'holds layers\.0\.attention\.wq\.weight/value at .* the index says'

# the index: every piece of rank 0's file said to be in rank 1's and the other way round
corrupt wrong_files '
x = index(); swap = {"rank_00000.safetensors": "rank_00001.safetensors", "rank_00001.safetensors": "rank_00000.safetensors"}
for t in x["tensors"].values():
    for blk in ("value", "adam_m", "adam_v"):
        for p in t[blk]: p["file"] = swap[p["file"]]
save_index(x)'
refused wrong_files 'rank_0000[01]\.safetensors holds .* the index says'

corrupt wrong_step 'x = index(); x["step"] = 5; save_index(x)'
refused wrong_step 'index\.json says step 5, the directory.s name step 2'

corrupt missing_piece 'x = index(); x["tensors"]["output.weight"]["adam_v"].pop(); save_index(x)'
refused missing_piece 'output\.weight/adam_v cover [0-9]+ of its [0-9]+ elements'

corrupt nan 'fill("rank_00001.safetensors", "layers.0.feed_forward.w2.weight/adam_m", float("nan")); refit("rank_00001.safetensors")'
refused nan 'rank_00001\.safetensors: layers\.0\.feed_forward\.w2\.weight/adam_m holds nan'

corrupt version_1 'x = index(); x["version"] = 1; save_index(x)'
refused version_1 'version 1, written before checkpoints held checksums'

# --data: the same size, one byte different
other=$tmp/other.txt
cp 08_full_trainer/data/tinyshakespeare.txt "$other"
printf 'X' | dd of="$other" bs=1 seek=5000 conv=notrunc status=none
corrupt other_data pass
refused other_data '^error: --resume: .*--data: checkpoint "[0-9]+ bytes, crc32 [0-9a-f]{8}", this run "[0-9]+ bytes, crc32' --data "$other"

corrupt other_lr pass
refused other_lr '^error: --resume: .*--lr: checkpoint 0\.003, this run 0\.001' --lr 1e-3

# a resume from the final checkpoint: nothing left to do
before=$(tree "$tmp/base")
run08 finished --ckpt-dir "$tmp/base" --resume
rc=$?; n=$((n+1))
if [ $rc -eq 0 ] && [ "$(wc -l <"$tmp/finished.txt")" -eq 1 ] && grep -q "nothing left to do" "$tmp/finished.txt" &&
   [ "$before" = "$(tree "$tmp/base")" ]; then echo "ok   finished: $(cat "$tmp/finished.txt")"
else echo "FAIL finished: exit $rc, want 0 and one line 'nothing left to do'"; sed 's/^/  | /' "$tmp/finished.txt" | head -8; bad=$((bad+1)); fi

# finite values that overflow: output.weight = 3e38 makes every logit infinite at step 3
corrupt overflow 'for f in ("rank_00000.safetensors", "rank_00001.safetensors"): fill(f, "output.weight/value", 3e38); refit(f)'
before=$(tree "$tmp/overflow")
run08 overflow --ckpt-dir "$tmp/overflow" --resume --ckpt-every 1
rc=$?; n=$((n+1))
errs=$(grep -c '^error:' "$tmp/overflow.txt")
if [ $rc -eq 4 ] && [ "$errs" -eq 1 ] && grep -qE '^error: step 3: the (loss|gradient norm) is' "$tmp/overflow.txt" &&
   grep -q "last good checkpoint is $tmp/overflow/$s2" "$tmp/overflow.txt" && [ "$before" = "$(tree "$tmp/overflow")" ]; then
    echo "ok   overflow: $(grep '^error:' "$tmp/overflow.txt")"
else
    echo "FAIL overflow: exit $rc (want 4), $errs error lines (want 1), directory $( [ "$before" = "$(tree "$tmp/overflow")" ] && echo unchanged || echo CHANGED)"
    sed 's/^/  | /' "$tmp/overflow.txt" | tail -8; bad=$((bad+1))
fi

echo "t_checkpoint_corrupt: $((n - bad)) of $n cases ok"
[ $bad -eq 0 ]
