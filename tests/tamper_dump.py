"""tamper_dump.py DIR grad|loss: make a correct dump wrong by a little, in place, so that
t_dump_torch.sh can show that reference_torch.py fails it (its rounding-tie search must not
explain a real difference away).
  grad  every step-1 gradient of the first feed_forward.w2.weight scaled by 1.003 (3e-3 > 1e-4)
  loss  step 1's loss in losses.txt scaled by 1 + 3e-4 (beyond the 1e-5 tolerance)
  dtype a bf16 dump's "dtype" metadata removed from init.safetensors: the replay then rounds
        nothing, and the run's bf16 roundings (about 2^-8) are beyond the fp32 tolerances
  aux   a mixture of experts' "aux_alpha" set to 0 in init.safetensors: the replay then leaves the
        load-balancing loss out, which the run's loss and router gradients hold
  blocks a bf16 context-parallel dump's "attention_blocks" removed: the replay then computes each
        sequence's attention whole, whose roundings are not the blocks' (each block's own softmax
        rounded, FlashAttention's backward), and a router's top-k turns those into other choices"""
import json
import os
import struct
import sys


def tamper_gradient(directory):
    path = os.path.join(directory, "grads_1.safetensors")
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    name = sorted(k for k in header if k.endswith("feed_forward.w2.weight"))[0]
    if header[name]["dtype"] != "F32":
        raise SystemExit(f"tamper_dump: {name} is {header[name]['dtype']}, not F32")
    begin, end = (8 + n + o for o in header[name]["data_offsets"])
    values = struct.unpack(f"<{(end - begin) // 4}f", raw[begin:end])
    raw[begin:end] = struct.pack(f"<{len(values)}f", *(v * 1.003 for v in values))
    with open(path, "wb") as f:
        f.write(raw)


def tamper_loss(directory):
    path = os.path.join(directory, "losses.txt")
    with open(path) as f:
        lines = f.read().split("\n")
    fields = lines[0].split()
    fields[1] = repr(float(fields[1]) * (1 + 3e-4))
    lines[0] = " ".join(fields)
    with open(path, "w") as f:
        f.write("\n".join(lines))


def edit_metadata(directory, edit):
    """init.safetensors rewritten with edit(metadata) applied to its __metadata__."""
    path = os.path.join(directory, "init.safetensors")
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    edit(header.get("__metadata__", {}), path)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)   # the data stays 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + raw[8 + n:])


def tamper_dtype(directory):
    def drop(meta, path):
        if meta.pop("dtype", None) != "bf16":
            raise SystemExit(f"tamper_dump: {path} is not a bf16 dump")
    edit_metadata(directory, drop)


def tamper_blocks(directory):
    def drop(meta, path):
        if meta.pop("attention_blocks", None) is None:
            raise SystemExit(f"tamper_dump: {path} has no attention_blocks")
    edit_metadata(directory, drop)


def tamper_aux(directory):
    def zero(meta, path):
        if "aux_alpha" not in meta:
            raise SystemExit(f"tamper_dump: {path} is not a mixture of experts' dump")
        meta["aux_alpha"] = "0"
    edit_metadata(directory, zero)


if __name__ == "__main__":
    parts = {"grad": tamper_gradient, "loss": tamper_loss, "dtype": tamper_dtype, "aux": tamper_aux,
             "blocks": tamper_blocks}
    if len(sys.argv) != 3 or sys.argv[2] not in parts:
        raise SystemExit("usage: tamper_dump.py DIR grad|loss|dtype|aux|blocks")
    parts[sys.argv[2]](sys.argv[1])
