#!/usr/bin/env python3
"""reference_torch.py: check a --dump directory against an independent PyTorch Llama.

    python3 tests/reference_torch.py DIR

DIR holds what a chapter's --dump wrote (docs/dump-format.md):
    init.safetensors      every parameter before step 1; __metadata__ holds the configuration
                          (dim, n_layers, n_heads, n_kv_heads, ffn_dim, vocab_size, seq_len,
                          norm_eps, rope_theta) and AdamW's (lr, beta1, beta2, eps, weight_decay),
                          and clip_grad_norm when the run clipped by global norm
    batch_K.safetensors   "tokens" and "targets", I32 [B, T], for steps K = 1, 2, ...
    grads_1.safetensors   every gradient of step 1
    losses.txt            "K loss" per line

This script rebuilds the model from the formulas alone (nothing from the C code), replays every
step with autograd and torch.optim.AdamW, and compares:
    loss of every step      |c - ref| <= 1e-5 * max(1, |ref|)
    gradients of step 1     max|c - ref| / max|ref| <= 1e-4, per tensor
It prints both tables and exits 0 when everything agrees, 1 when something does not, 2 when
the directory cannot be read.

The reference runs in float64. The C model runs in fp32, so the comparison measures the C
model's error against (nearly) exact arithmetic; a float32 reference would add its own rounding
of the same size and the tolerances would have to absorb two errors instead of one.

Safetensors is read with struct, json and numpy only: the format is an 8-byte little-endian
header length, a JSON header, then the raw little-endian tensor bytes.
"""
import json
import math
import os
import re
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-4
IGNORE_INDEX = -100
DTYPE = torch.float64


class DumpError(Exception):
    """The dump directory is missing something or holds something malformed."""


# ---------------------------------------------------------------------------- reading the dump
NUMPY_DTYPES = {"F32": "<f4", "F64": "<f8", "I32": "<i4", "I64": "<i8"}


def read_safetensors(path):
    """Returns ({name: numpy array}, {metadata key: string})."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise DumpError(f"cannot read {path}: {e.strerror}")
    if len(blob) < 8:
        raise DumpError(f"{path}: {len(blob)} bytes, too short for a safetensors file")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if 8 + header_len > len(blob):
        raise DumpError(f"{path}: header length {header_len} runs past the end of the file")
    try:
        header = json.loads(blob[8:8 + header_len])
    except ValueError as e:
        raise DumpError(f"{path}: header is not JSON ({e})")
    data = blob[8 + header_len:]

    metadata = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in header.items():
        if info["dtype"] not in NUMPY_DTYPES:
            raise DumpError(f"{path}: tensor {name} has dtype {info['dtype']}, "
                            f"expected one of {sorted(NUMPY_DTYPES)}")
        begin, end = info["data_offsets"]
        if not 0 <= begin <= end <= len(data):
            raise DumpError(f"{path}: tensor {name} has offsets [{begin}, {end}) outside "
                            f"the {len(data)}-byte data section")
        array = np.frombuffer(data[begin:end], dtype=NUMPY_DTYPES[info["dtype"]])
        if array.size != math.prod(info["shape"]):
            raise DumpError(f"{path}: tensor {name} has {array.size} elements, "
                            f"shape {info['shape']} needs {math.prod(info['shape'])}")
        tensors[name] = array.reshape(info["shape"])
    return tensors, metadata


def read_config(metadata, path):
    """The model and optimizer settings, from init.safetensors' metadata strings."""
    ints = ["dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "seq_len"]
    floats = ["norm_eps", "rope_theta", "lr", "beta1", "beta2", "eps", "weight_decay"]
    config = {}
    for key in ints + floats:
        if key not in metadata:
            raise DumpError(f"{path}: metadata has no '{key}'")
        config[key] = int(metadata[key]) if key in ints else float(metadata[key])
    # optional: gradient clipping by global norm (grads_1 holds the gradients before clipping)
    if "clip_grad_norm" in metadata:
        config["clip_grad_norm"] = float(metadata["clip_grad_norm"])
    return config


def read_losses(path):
    """{step: loss} from the "step loss" lines of losses.txt."""
    losses = {}
    try:
        with open(path) as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                fields = line.split()
                if len(fields) != 2:
                    raise DumpError(f"{path}:{line_no}: expected 'step loss', got {line.strip()!r}")
                losses[int(fields[0])] = float(fields[1])
    except OSError as e:
        raise DumpError(f"cannot read {path}: {e.strerror}")
    return losses


def expected_shapes(config):
    """{name: shape} of every tensor of the model (docs/dump-format.md), in the table's order."""
    D, F_, V = config["dim"], config["ffn_dim"], config["vocab_size"]
    hd = D // config["n_heads"]
    q_dim, kv_dim = config["n_heads"] * hd, config["n_kv_heads"] * hd
    shapes = {"tok_embeddings.weight": (V, D)}
    for i in range(config["n_layers"]):
        shapes.update({
            f"layers.{i}.attention_norm.weight": (D,),
            f"layers.{i}.attention.wq.weight": (q_dim, D),
            f"layers.{i}.attention.wk.weight": (kv_dim, D),
            f"layers.{i}.attention.wv.weight": (kv_dim, D),
            f"layers.{i}.attention.wo.weight": (D, q_dim),
            f"layers.{i}.ffn_norm.weight": (D,),
            f"layers.{i}.feed_forward.w1.weight": (F_, D),
            f"layers.{i}.feed_forward.w2.weight": (D, F_),
            f"layers.{i}.feed_forward.w3.weight": (F_, D),
        })
    shapes["norm.weight"] = (D,)
    shapes["output.weight"] = (V, D)
    return shapes


def check_tensors(tensors, config, path):
    """Every tensor of the model present with its shape, and nothing else."""
    shapes = expected_shapes(config)
    for name, shape in shapes.items():
        if name not in tensors:
            raise DumpError(f"{path}: no tensor {name}")
        if tuple(tensors[name].shape) != shape:
            raise DumpError(f"{path}: {name} has shape {list(tensors[name].shape)}, "
                            f"expected {list(shape)}")
    for name in tensors:
        if name not in shapes:
            raise DumpError(f"{path}: unexpected tensor {name}")


def batch_steps(directory):
    """The K of every batch_K.safetensors, in order; they must be 1, 2, ..., n."""
    steps = sorted(int(m.group(1)) for name in os.listdir(directory)
                   if (m := re.fullmatch(r"batch_(\d+)\.safetensors", name)))
    if not steps:
        raise DumpError(f"{directory}: no batch_K.safetensors files")
    if steps != list(range(1, len(steps) + 1)):
        raise DumpError(f"{directory}: batch steps {steps} are not 1, 2, ..., n (one is missing)")
    return steps


# ---------------------------------------------------------------------------- the model
def rmsnorm(x, weight, eps):
    """x / sqrt(mean(x^2) + eps) * weight, over the last dimension."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def rope(x, theta):
    """Rotary position embedding on interleaved pairs (2j, 2j+1) of each head.

    x: [B, T, H, hd]; the token at position t (its index in the sequence) has its pair j
    rotated by the angle t * theta^(-2j/hd):  (a, b) -> (a cos - b sin, a sin + b cos).
    """
    B, T, H, hd = x.shape
    j = torch.arange(hd // 2, dtype=x.dtype)
    freq = theta ** (-2.0 * j / hd)                                   # [hd/2]
    angle = torch.arange(T, dtype=x.dtype)[:, None] * freq[None, :]   # [T, hd/2]
    cos = angle.cos()[None, :, None, :]                               # [1, T, 1, hd/2]
    sin = angle.sin()[None, :, None, :]
    a, b = x[..., 0::2], x[..., 1::2]                                 # [B, T, H, hd/2] each
    rotated = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)  # [B, T, H, hd/2, 2]
    return rotated.flatten(start_dim=-2)                              # pairs back in place


def attention(q, k, v):
    """Causal attention with grouped-query heads.

    q: [B, T, H, hd], k and v: [B, T, Hkv, hd]. Query head h reads kv head h // (H / Hkv):
    repeat_interleave turns kv heads [0, 1] into [0, 0, 1, 1] for H = 4, Hkv = 2.
    Returns [B, T, H * hd].
    """
    B, T, H, hd = q.shape
    group = H // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))                  # [B, H, T, hd]
    scores = q @ k.transpose(-2, -1) / math.sqrt(hd)                  # [B, H, T, T]
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)      # key after query
    scores = scores.masked_fill(future, float("-inf"))
    out = scores.softmax(dim=-1) @ v                                  # [B, H, T, hd]
    return out.transpose(1, 2).reshape(B, T, H * hd)


def forward(params, config, tokens):
    """logits [B, T, V] of the Llama of docs/dump-format.md; params maps torchtitan names to tensors."""
    B, T = tokens.shape
    H, Hkv = config["n_heads"], config["n_kv_heads"]
    hd = config["dim"] // H
    eps, theta = config["norm_eps"], config["rope_theta"]

    h = params["tok_embeddings.weight"][tokens]                       # [B, T, D]
    for i in range(config["n_layers"]):
        def w(name):
            return params[f"layers.{i}.{name}.weight"]

        # attention block: h += wo(attention(rope(wq n), rope(wk n), wv n)),  n = rmsnorm(h)
        n = rmsnorm(h, w("attention_norm"), eps)
        q = (n @ w("attention.wq").T).view(B, T, H, hd)
        k = (n @ w("attention.wk").T).view(B, T, Hkv, hd)
        v = (n @ w("attention.wv").T).view(B, T, Hkv, hd)
        h = h + attention(rope(q, theta), rope(k, theta), v) @ w("attention.wo").T

        # feed-forward block: h += w2(silu(w1 m) * w3 m),  m = rmsnorm(h)
        m = rmsnorm(h, w("ffn_norm"), eps)
        h = h + (F.silu(m @ w("feed_forward.w1").T) * (m @ w("feed_forward.w3").T)) \
            @ w("feed_forward.w2").T

    return rmsnorm(h, params["norm.weight"], eps) @ params["output.weight"].T


def mean_loss(logits, targets):
    """Sum of token cross-entropies over targets != -100, divided by their count."""
    V = logits.shape[-1]
    total = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1),
                            ignore_index=IGNORE_INDEX, reduction="sum")
    count = int((targets != IGNORE_INDEX).sum())
    return total / max(count, 1)          # an all-padding batch: an empty sum, loss 0


# ---------------------------------------------------------------------------- comparing
def relative_diff(got, ref):
    """max|got - ref| / max|ref|, with 0/0 = 0 (the parity metric of docs/design.md)."""
    diff = float(np.max(np.abs(got - ref))) if got.size else 0.0
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    if scale == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / scale


def run(directory):
    init, metadata = read_safetensors(os.path.join(directory, "init.safetensors"))
    config = read_config(metadata, os.path.join(directory, "init.safetensors"))
    check_tensors(init, config, os.path.join(directory, "init.safetensors"))
    losses = read_losses(os.path.join(directory, "losses.txt"))
    steps = batch_steps(directory)
    grads_path = os.path.join(directory, "grads_1.safetensors")
    c_grads = None
    if os.path.exists(grads_path):
        c_grads = read_safetensors(grads_path)[0]
        check_tensors(c_grads, config, grads_path)

    print(f"reference_torch: {directory}, {len(steps)} steps, {len(init)} tensors, "
          f"reference in {str(DTYPE).replace('torch.', '')}")
    print("  config: " + ", ".join(f"{k} {v:g}" for k, v in config.items()))

    # The parameters, as float64 leaves in the file's order, and the optimizer over them.
    params = {name: torch.tensor(array, dtype=DTYPE, requires_grad=True)
              for name, array in init.items()}
    optimizer = torch.optim.AdamW(params.values(), lr=config["lr"],
                                  betas=(config["beta1"], config["beta2"]),
                                  eps=config["eps"], weight_decay=config["weight_decay"])

    failures = 0
    print(f"\n  {'step':>4} {'loss (dump)':>14} {'loss (torch)':>14} {'|diff|':>10}  verdict")
    for step in steps:
        batch, _ = read_safetensors(os.path.join(directory, f"batch_{step}.safetensors"))
        tokens = torch.from_numpy(batch["tokens"].astype(np.int64))
        targets = torch.from_numpy(batch["targets"].astype(np.int64))

        optimizer.zero_grad(set_to_none=True)
        loss = mean_loss(forward(params, config, tokens), targets)
        loss.backward()

        ref = loss.item()
        if step in losses:
            got = losses[step]
            ok = abs(got - ref) <= LOSS_RTOL * max(1.0, abs(ref))
            failures += not ok
            print(f"  {step:>4} {got:>14.9g} {ref:>14.9g} {abs(got - ref):>10.3e}  "
                  f"{'ok' if ok else 'FAIL'}")
        else:
            failures += 1
            print(f"  {step:>4} {'(missing)':>14} {ref:>14.9g} {'':>10}  FAIL")

        if step == 1 and c_grads is not None:
            grad_table = [(name, p.grad.detach().clone().numpy()) for name, p in params.items()]
        if "clip_grad_norm" in config:
            torch.nn.utils.clip_grad_norm_(list(params.values()), config["clip_grad_norm"])
        optimizer.step()

    if c_grads is None:
        failures += 1
        print(f"\n  {grads_path}: missing, step-1 gradients not compared  FAIL")
    else:
        print(f"\n  step-1 gradients: max|dump - torch| / max|torch| per tensor "
              f"(tolerance {GRAD_RTOL:g})")
        print(f"  {'tensor':<36} {'max|torch|':>12} {'rel diff':>12}  verdict")
        for name, ref in grad_table:
            rel = relative_diff(c_grads[name].astype(np.float64), ref)
            ok = rel <= GRAD_RTOL
            failures += not ok
            print(f"  {name:<36} {np.max(np.abs(ref)):>12.4e} {rel:>12.3e}  "
                  f"{'ok' if ok else 'FAIL'}")

    print(f"\nreference_torch: {'PASS' if failures == 0 else f'FAIL ({failures} failed)'}")
    return 0 if failures == 0 else 1


def main(argv):
    if len(argv) != 2:
        print(f"usage: {argv[0]} DUMP_DIR   (a directory written by a chapter's --dump)",
              file=sys.stderr)
        return 2
    if not os.path.isdir(argv[1]):
        print(f"reference_torch: {argv[1]} is not a directory", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    try:
        return run(argv[1])
    except DumpError as e:
        print(f"reference_torch: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
