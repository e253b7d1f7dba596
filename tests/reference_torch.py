#!/usr/bin/env python3
"""reference_torch.py: check a --dump directory against an independent PyTorch Llama.

    python3 tests/reference_torch.py DIR
    python3 tests/reference_torch.py DIR DIR...     each DIR's report into DIR/reference.txt, and
                                                    one line "DIR STATUS" per DIR; exits with the
                                                    worst status (tests/t_dump_torch.sh: one
                                                    start of PyTorch for every dump)

DIR holds what a chapter's --dump wrote (docs/dump-format.md):
    init.safetensors      every parameter before step 1; __metadata__ holds the configuration
                          (dim, n_layers, n_heads, n_kv_heads, ffn_dim, vocab_size, seq_len,
                          norm_eps, rope_theta) and AdamW's (lr, beta1, beta2, eps, weight_decay),
                          and clip_grad_norm when the run clipped by global norm
    batch_K.safetensors   "tokens" and "targets", I32 [B, T], for steps K = 1, 2, ...
    grads_1.safetensors   every gradient of step 1
    losses.txt            "K loss" per line, or "K loss lr" with a scheduled learning rate
and, in init.safetensors' metadata, an optional "run_options" JSON object with a chapter's own
settings. This script reads two: "float8" (chapter 07): the block linears named in
"float8_linears" then run on float8 operands, as described under "float8 training" below; and
"reduce" ({"dtype": "bf16", "data_ranks": N[, "passes": P][, "microbatches": M]}, chapters 04 and
08 with --reduce-dtype bf16): the gradients were summed in bf16 over N data ranks, each holding an
equal block of the batch's rows in order, once per pass and microbatch, which step_loss_reduced
replays (each rank's gradient rounded, their sum rounded once).

This script rebuilds the model from the formulas alone (nothing from the C code), replays every
step with autograd and torch.optim.AdamW, and compares:
    loss of every step      |c - ref| <= 1e-5 * max(1, |ref|)   (a float8 dump: step 1's only)
    gradients of step 1     max|c - ref| / max|ref| <= 1e-4, per tensor
A bf16 dump (metadata "dtype": every linear's GEMM operands rounded to bf16, bf16_linear below, and
attention's two products' operands, both Bf16Product) is
compared at bf16's tolerances (docs/design.md, "Parity in bf16"): the loss within
4u / sqrt(tokens) relative, u = 2^-8, tokens those of batch_1; each gradient within 4u, in the max
norm only (the C check adds an l2 norm).
It prints both tables and exits 0 when everything agrees, 1 when something does not, 2 when
the directory cannot be read.

The reference runs in float64. The C model runs in fp32, so the comparison measures the C
model's error against (nearly) exact arithmetic; a float32 reference would add its own rounding
of the same size and the tolerances would have to absorb two errors instead of one.

float8 training (run_options {"float8": {"recipe", "amax_history", "float8_linears", "formats",
"activation_groups", "scale_rule"}}, and "passes" when above 1; chapters 07 and 08 write it;
scale_rule is a note for a person, the recipe decides):
each named linear (wq wk wv wo w1 w2 w3 of every layer; never the output layer) is an
autograd.Function whose three GEMMs multiply fake-quantized operands, computed here from the
formats' definitions:
    forward    y  = xq Wq^T        x, W cast to formats["x"], formats["w"]
    backward   dx = dyq Wq         dy cast to formats["dy"]
               dW = dyq^T xq
A cast takes the fp32 value v (the float64 activation rounded to fp32, as the run holds it),
multiplies it by the fp32 scale s in fp32, rounds to the nearest float8 value (ties to even),
saturating at +-max (E4M3fn 448, E5M2 57344; NaN stays NaN), and divides by s in fp32 (torchao's
hp_tensor_to_float8 with to_fp8_saturated, then to_original_precision). The scale is
fp32(max / max(amax, 1e-12)) with the division in double; the recipe decides which amax:
    tensorwise  this step's amax of the whole tensor; the backward reuses the forward's x and W
                (the same casts) and casts dy once
    rowwise     one scale per row of each operand along each GEMM's contraction, rounded down to
                a power of two (frexp; the run's formats: E4M3 for all): forward x and W by rows
                (over in); dx's dy by rows and W by columns (over out); dW's dy and x by columns
                (over the tokens)
    delayed     as tensorwise, with the largest amax of the last amax_history passes of that
                tensor (per linear and per operand; the first: its own amax), this pass's amax
                then joining the history (one pass a step, unless "passes" says more)
With data parallelism each rank scales the activations (x, dy) of its own rows of the batch:
"activation_groups" (the data-parallel degree, 1 without) says in how many equal blocks of the
batch's rows (sequences 0.., in rank order) x and dy are scaled, each block with its own scales
(and, delayed, its own amax history); the weights are scaled whole. Chapter 08 writes as
activation_groups the data ranks times a pipeline's microbatches (each data rank's rows in
microbatches, each cast apart). "passes" (chapter 08's --accum; 1 when absent): a step was that
many forward-backward passes, one per equal block of the batch's rows in order, each casting
its own rows (in activation_groups blocks) and its own weights; the replay makes the same passes
(step_loss). The run agreed the amaxes over tensor parallelism, so its casts are the
single-device ones that this script computes. A run whose context parallelism split the
sequences (each cp rank scaling its own positions) cannot be described: chapter 08 refuses
--dump with --fp8 and --cp above 1.

The replay of a float8 run cannot be bit-exact: a value on a rounding boundary lands on the
neighbouring float8 code when its fp32 input differs in the last bit from the run's (a sum in
another order), and that moves it by a whole float8 step. Step 1's loss and gradients are judged
as for every dump, at the same tolerances. When step-1 gradients or its loss miss them, the
script asks whether rounding ties explain it: it lists step 1's activation values that lie within
BOUNDARY_STEPS of a rounding midpoint (the candidates) and re-runs step 1 with a few of the
nearest cast to their other neighbour (every cast of one value together; singles, pairs, triples,
then the nearest k), then follows chained ties, values that a first flip moved next to a midpoint
(a beam search, CHAIN_WIDTH x CHAIN_DEPTH; explain_by_boundaries). If one such set brings every
gradient and the loss within the tolerances, the difference is the run's rounding of those values,
named in the output, and step 1 passes; a wrong format, scale or recipe moves far more than a few
values and still fails (t_dump_torch.sh tampers with a dump to show it). The losses after step 1
of a float8 dump are shown, not judged (FLOAT8_LATER_LOSSES).

What this cannot do: the replay computes in float64 and the run in fp32, so every cast's input
differs in its last bits and a larger run has more values near a midpoint; past a few flips and
their chains the search gives up. Chapter 08's larger model with tensorwise casts and --accum 2
meets that on some seeds (a correct run reported as failing); the dump would need the run's own
float8 codes for a replay that checks each cast locally.

Safetensors is read with struct, json and numpy only: the format is an 8-byte little-endian
header length, a JSON header, then the raw little-endian tensor bytes.
"""
import contextlib
import json
import itertools
import math
import os
import re
import struct
import sys
import traceback

import numpy as np
import torch
import torch.nn.functional as F

LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-4
BF16_U = 2.0 ** -8     # bf16's unit roundoff (8 significant bits)
# float8 over bf16 (--fp8 with --dtype bf16): an operand the replay rounds to bf16 differs from the
# run's by a whole bf16 ulp where the two values straddle a bf16 rounding boundary (the bf16
# replay's premise), and where that ulp also straddles a float8 boundary, about one in 16 of them
# (a bf16 ulp, 2^-7 of a value, is 2^-4 of an E4M3 step), the cast lands on the neighbouring float8
# code: one element a whole float8 step (2^-3 of it) off. The max norm sees that one element; the
# l2 norm weighs it by its share, as it weighs the bf16 cascade the tolerance 4u is derived for
# (docs/design.md, "Parity in bf16", whose derivation is in l2), so a float8 dump in bf16 is
# judged in the l2 norm at 4u, with the max norm shown.
FLOAT8_OVER_BF16 = "a float8 step on a few elements, counted by their share"
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
    # optional: mixed precision (absent: fp32); bf16 rounds every linear's GEMM operands
    dtype = metadata.get("dtype", "fp32")
    if dtype not in ("fp32", "bf16"):
        raise DumpError(f"{path}: metadata dtype '{dtype}' is not fp32 or bf16")
    if dtype == "bf16":
        config["bf16"] = 1
    # optional: context parallelism's attention blocks under bf16 (absent: the whole sequence)
    if "attention_blocks" in metadata:
        blocks = int(metadata["attention_blocks"])
        if dtype != "bf16" or blocks < 1 or config["seq_len"] % blocks:
            raise DumpError(f"{path}: metadata attention_blocks {blocks} needs dtype bf16 and to divide seq_len")
        config["attention_blocks"] = blocks
    # optional: a mixture of experts (chapter 09; absent: dense), docs/dump-format.md
    if "experts" in metadata:
        for key in ("experts", "top_k", "expert_dim", "shared_expert", "aux_alpha"):
            if key not in metadata:
                raise DumpError(f"{path}: metadata has 'experts' but no '{key}'")
            config[key] = float(metadata[key]) if key == "aux_alpha" else int(metadata[key])
        if "capacity_factor" in metadata:   # absent: dropless
            config["capacity_factor"] = float(metadata["capacity_factor"])
        if "moe_every" in metadata:   # absent: every layer a mixture
            config["moe_every"] = int(metadata["moe_every"])
            if config["moe_every"] < 1:
                raise DumpError(f"{path}: metadata moe_every {config['moe_every']} is not a positive layer count")
        if "router" in metadata:      # absent: softmax
            config["router"] = metadata["router"]
            if config["router"] not in ("softmax", "sigmoid"):
                raise DumpError(f"{path}: metadata router '{config['router']}' is not softmax or sigmoid")
    return config


def is_moe(config, i):
    """Layer i's feed-forward is the mixture of experts: every layer's, or with moe_every K the
    layers i with (i + 1) % K == 0 (Llama's dense feed-forward on the others)."""
    return "experts" in config and (i + 1) % config.get("moe_every", 1) == 0


def read_run_options(metadata, path):
    """The chapter's own settings: the "run_options" JSON object, {} when there is none."""
    if "run_options" not in metadata:
        return {}
    try:
        options = json.loads(metadata["run_options"])
    except ValueError as e:
        raise DumpError(f"{path}: metadata 'run_options' is not JSON ({e})")
    if not isinstance(options, dict):
        raise DumpError(f"{path}: metadata 'run_options' is not a JSON object")
    unknown = sorted(set(options) - {"float8", "reduce"})
    if unknown:   # a setting this script does not reproduce: refuse rather than replay wrongly
        raise DumpError(f"{path}: run_options has {unknown}, which this script does not replay")
    return options


def read_losses(path):
    """{step: loss} and {step: lr} from losses.txt: "step loss" lines, or "step loss lr" when the
    run scheduled its learning rate (the lr that step's update used)."""
    losses, lrs = {}, {}
    try:
        with open(path) as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                fields = line.split()
                if len(fields) not in (2, 3):
                    raise DumpError(f"{path}:{line_no}: expected 'step loss' or 'step loss lr', got {line.strip()!r}")
                losses[int(fields[0])] = float(fields[1])
                if len(fields) == 3:
                    lrs[int(fields[0])] = float(fields[2])
    except OSError as e:
        raise DumpError(f"cannot read {path}: {e.strerror}")
    return losses, lrs


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
        })
        if not is_moe(config, i):
            shapes.update({
                f"layers.{i}.feed_forward.w1.weight": (F_, D),
                f"layers.{i}.feed_forward.w2.weight": (D, F_),
                f"layers.{i}.feed_forward.w3.weight": (F_, D),
            })
            continue
        E, Fe = config["experts"], config["expert_dim"]
        shapes.update({
            f"layers.{i}.moe.router.gate.weight": (E, D),
            f"layers.{i}.moe.experts.w1": (E * Fe, D),
            f"layers.{i}.moe.experts.w2": (E * D, Fe),
            f"layers.{i}.moe.experts.w3": (E * Fe, D),
        })
        if config["shared_expert"]:
            shapes.update({
                f"layers.{i}.moe.shared_expert.w1.weight": (F_, D),
                f"layers.{i}.moe.shared_expert.w2.weight": (D, F_),
                f"layers.{i}.moe.shared_expert.w3.weight": (F_, D),
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


# ---------------------------------------------------------------------------- float8
# The two formats: mantissa bits, the exponent of the smallest normal number, the largest finite
# value (E4M3fn: 1.75 * 2^8, E5M2: 1.75 * 2^15). torch.float8_* dtypes appeared in PyTorch 2.1;
# the cast is computed from these definitions instead, so any version replays the same values.
FLOAT8_FORMATS = {"e4m3fn": (3, -6, 448.0), "e5m2": (2, -14, 57344.0)}
FLOAT8_LINEARS = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")   # the block linears: never output
FLOAT8_RECIPES = ("tensorwise", "rowwise", "delayed")
AMAX_EPS = 1e-12            # torchao's floor on amax in the scale
# After step 1 the run's parameters and the replay's differ in their last bits, and every cast of
# a value next to a rounding boundary turns such a difference into a whole float8 step: the
# losses of steps 2.. are shown, not judged (step 1's loss and gradients are).
FLOAT8_LATER_LOSSES = "shown, not judged"


def read_float8(options, path):
    """The float8 settings of run_options, checked: {recipe, amax_history, linears, formats}."""
    f8 = options.get("float8")
    if f8 is None:
        return None
    if not isinstance(f8, dict):
        raise DumpError(f"{path}: run_options.float8 is not an object")
    recipe = f8.get("recipe")
    if recipe not in FLOAT8_RECIPES:
        raise DumpError(f"{path}: run_options.float8.recipe is {recipe!r}, expected one of "
                        f"{', '.join(FLOAT8_RECIPES)}")
    history = f8.get("amax_history")
    if recipe == "delayed" and (not isinstance(history, int) or history < 1):
        raise DumpError(f"{path}: run_options.float8.amax_history is {history!r}, expected an "
                        f"integer >= 1")
    linears = f8.get("float8_linears")
    if not isinstance(linears, list) or not set(linears) <= set(FLOAT8_LINEARS):
        raise DumpError(f"{path}: run_options.float8.float8_linears is {linears!r}, expected "
                        f"names among {', '.join(FLOAT8_LINEARS)}")
    formats = f8.get("formats")
    if not isinstance(formats, dict) or any(formats.get(k) not in FLOAT8_FORMATS
                                            for k in ("x", "w", "dy")):
        raise DumpError(f"{path}: run_options.float8.formats is {formats!r}, expected x, w "
                        f"and dy each one of {', '.join(FLOAT8_FORMATS)}")
    counts = {}
    for key in ("activation_groups", "passes"):
        counts[key] = f8.get(key, 1)
        if not isinstance(counts[key], int) or isinstance(counts[key], bool) or counts[key] < 1:
            raise DumpError(f"{path}: run_options.float8.{key} is {counts[key]!r}, expected an "
                            f"integer >= 1")
    return {"recipe": recipe, "amax_history": history, "linears": set(linears),
            "formats": {k: formats[k] for k in ("x", "w", "dy")},
            "groups": counts["activation_groups"], "passes": counts["passes"]}


def round_to_float8(v, fmt):
    """The float8 value nearest to each element of the fp32 tensor v, ties to even, saturating:
    |v| beyond the largest finite value (infinity included) gives +-max; NaN stays NaN. fp32.

    A float8 number of binade [2^e, 2^(e+1)) is a multiple of 2^(e - mbits); below the smallest
    normal 2^emin (the subnormals) every number is a multiple of 2^(emin - mbits). So v is
    rounded to an integer multiple of its binade's quantum: in float64 the division by a power
    of two is exact, torch.round rounds halves to even, and an even multiple is an even code
    (the mantissa's last bit). A value rounding up out of its binade lands on 2^(e+1), the next
    binade's first number; clamping to +-max first leaves nothing above max to round."""
    mbits, emin, fmax = FLOAT8_FORMATS[fmt]
    a = v.double().clamp(-fmax, fmax)                   # saturation (clamp keeps NaN)
    _, e = torch.frexp(a)                               # a = m 2^e, m in [0.5, 1): binade e - 1
    e = torch.clamp(e - 1, min=emin).double()           # subnormals: the smallest normal's quantum
    quantum = torch.pow(2.0, e - mbits)
    return (torch.round(a / quantum) * quantum).float()


def check_float8_arithmetic():
    """The cast on values whose rounding is known: ties go to the even code, saturation, the
    subnormals and their boundary with the normals, NaN. Also against torch's own float8 cast
    (clamp, then .to(dtype), torchao's to_fp8_saturated) where this PyTorch has one. And the
    scales against numpy's. Returns the list of disagreements (empty when all is right)."""
    nan, inf = float("nan"), float("inf")
    cases = {"e4m3fn": [(1 + 1 / 16, 1.0), (1 + 3 / 16, 1.25), (1 + 1 / 16 + 2 ** -20, 1.125),
                        (-(1 + 3 / 16), -1.25), (440.0, 448.0), (464.0, 448.0), (1e30, 448.0),
                        (inf, 448.0), (-inf, -448.0), (2 ** -10, 0.0), (3 * 2 ** -10, 2 ** -8),
                        (15 * 2 ** -10, 2 ** -6), (2 ** -6 + 2 ** -10, 2 ** -6), (1e-30, 0.0),
                        (nan, nan)],
             "e5m2": [(1 + 1 / 8, 1.0), (1 + 3 / 8, 1.5), (61440.0, 57344.0), (inf, 57344.0),
                      (-1e30, -57344.0), (2 ** -17, 0.0), (3 * 2 ** -17, 2 ** -15),
                      (7 * 2 ** -17, 2 ** -14), (nan, nan)]}
    dtypes = {"e4m3fn": getattr(torch, "float8_e4m3fn", None),
              "e5m2": getattr(torch, "float8_e5m2", None)}
    problems = []
    for fmt, pairs in cases.items():
        v = torch.tensor([p[0] for p in pairs], dtype=torch.float32)
        want = torch.tensor([p[1] for p in pairs], dtype=torch.float32)
        got = round_to_float8(v, fmt)
        refs = [("expected", want)]
        if dtypes[fmt] is not None:
            fmax = FLOAT8_FORMATS[fmt][2]
            refs.append((f"torch.{dtypes[fmt]}", v.clamp(-fmax, fmax).to(dtypes[fmt]).float()))
        for name, ref in refs:
            same = (got == ref) | (torch.isnan(got) & torch.isnan(ref))
            for i in torch.nonzero(~same).flatten().tolist():
                problems.append(f"{fmt}: {v[i].item()!r} -> {got[i].item()!r}, "
                                f"{name} {ref[i].item()!r}")
    # the scales: numpy's float64 division, rounded to fp32, and frexp's power of two
    amax = np.concatenate([[0.0, 1e-13, 1.0, 448.0, 3.0, np.inf, np.nan],
                           np.random.default_rng(0).lognormal(0, 8, 1000)]).astype(np.float32)
    for fmt, fmax in (("e4m3fn", 448.0), ("e5m2", 57344.0)):
        with np.errstate(divide="ignore", invalid="ignore"):
            want = (fmax / np.maximum(amax.astype(np.float64), AMAX_EPS)).astype(np.float32)
            want[np.isnan(amax)] = np.nan
            m, e = np.frexp(want)
            want2 = np.where((want > 0) & np.isfinite(want), np.ldexp(np.float32(1), e - 1), want)
        for pow2, ref in ((False, want), (True, want2)):
            got = float8_scale(torch.from_numpy(amax), fmt, pow2).numpy()
            wrong = ~((got == ref) | (np.isnan(got) & np.isnan(ref)))
            for i in np.nonzero(wrong)[0][:3]:
                problems.append(f"{fmt} scale of amax {amax[i]!r}{' (pow2)' if pow2 else ''}: "
                                f"{got[i]!r}, expected {ref[i]!r}")
    return problems


def float8_scale(amax, fmt, pow2):
    """fp32(max / max(amax, 1e-12)), the division in double (amax: an fp32 tensor, any shape);
    pow2: rounded down to a power of two, 2^(e-1) for scale = f 2^e with f in [0.5, 1) (frexp);
    0, inf and NaN kept. A NaN amax gives NaN, an infinite one 0."""
    a = amax.double()
    a = torch.where(a < AMAX_EPS, torch.full_like(a, AMAX_EPS), a)   # NaN < eps is false: kept
    # a tensor by a tensor: IEEE division (a Python number divided by a tensor is computed as
    # the number times the tensor's reciprocal, which can differ in the last bit)
    scale = (torch.full_like(a, FLOAT8_FORMATS[fmt][2]) / a).float()
    if pow2:
        _, e = torch.frexp(scale)
        down = torch.pow(2.0, (e - 1).double()).float()
        scale = torch.where((scale > 0) & ~torch.isinf(scale), down, scale)
    return scale


def amax_of(v, dim=None):
    """max |v| (fp32), NaN propagating as torch.max does; over dim, kept for broadcasting."""
    return v.abs().amax() if dim is None else v.abs().amax(dim=dim, keepdim=True)


def fake_quantize(v, scale, fmt):
    """v (fp32) cast to float8 with scale (fp32, broadcast) and back: round(v * s) / s in fp32."""
    return round_to_float8(v * scale, fmt) / scale


# How close to a rounding midpoint a scaled value must be, in float8 steps, to be listed as a
# boundary value in step 1 (about 16 fp32 ulps for E4M3, 32 for E5M2): its code then depends on
# the last bits of the fp32 input, which the run computed in another order. Only the activations
# (x, dy) are listed: step 1's weights are the dump's own fp32 values, cast exactly as the run.
BOUNDARY_STEPS = 2.0 ** -16
# A float8 dump whose step-1 gradients miss the tolerance is re-run with this many of the values
# nearest a midpoint cast the other way (explain_by_boundaries).
FLIP_TRIES = 8
# Chained ties: a value cast to its other neighbour moves what is computed from it by a float8
# step, which can put a later value next to a midpoint that was not near one before (and the run,
# which rounded the first value that way, saw that second tie too). The search grows chains of up
# to CHAIN_DEPTH + 1 flips, keeping at each length the CHAIN_WIDTH chains whose gradients come
# nearest the run's, each grown by one of the CHAIN_CANDIDATES values nearest a midpoint in its
# replay (explain_by_boundaries).
CHAIN_WIDTH = 3
CHAIN_DEPTH = 3
CHAIN_CANDIDATES = 32
# A chained tie lies further from its midpoint in this replay than a first one: its input comes
# after a whole float8 step and more fp32 sums of the run (measured: a chained dy at 3.2e-5 of a
# step, twice BOUNDARY_STEPS), so the values listed for a chain's next flip are those within
# CHAIN_BOUNDARY_STEPS. What is judged stays the same: every gradient within GRAD_RTOL, the loss
# within LOSS_RTOL.
CHAIN_BOUNDARY_STEPS = 2.0 ** -14


def boundary_distance(p, fmt):
    """For each fp32 scaled value p: its distance to the nearest rounding midpoint of fmt, in
    float8 steps (0: an exact tie; 0.5: on a float8 number). Values clamped to +-max: 0.5."""
    mbits, emin, fmax = FLOAT8_FORMATS[fmt]
    a = p.double()
    _, e = torch.frexp(a)
    steps = a.abs() / torch.pow(2.0, torch.clamp(e - 1, min=emin).double() - mbits)
    d = (steps - torch.floor(steps) - 0.5).abs()
    return torch.where(a.abs() < fmax, d, torch.full_like(d, 0.5))   # NaN: False, 0.5


# The linears that read one tensor: the run casts that one fp32 tensor once per linear, with the
# same scales, so a value of it on a rounding tie is rounded alike in all of them (and flips in
# all of them together, explain_by_boundaries): the attention's input n for wq, wk, wv, the
# feed-forward's m for w1, w3.
SHARED_INPUTS = {"wq": "wq wk wv", "wk": "wq wk wv", "wv": "wq wk wv", "w1": "w1 w3", "w3": "w1 w3"}


class Float8State:
    """The recipe, and what it keeps across steps: the delayed amax histories, per linear (layer,
    name) and operand ("x", "w", "dy"), newest first, at most amax_history. In step 1 it also
    notes the boundary values of every cast (BOUNDARY_STEPS), for the report."""

    def __init__(self, f8, flipped=(), radius=None):
        self.recipe, self.formats, self.linears = f8["recipe"], f8["formats"], f8["linears"]
        self.history_len, self.groups = f8["amax_history"], f8["groups"]
        self.passes = f8.get("passes", 1)
        self.bf16 = bool(f8.get("bf16"))   # --dtype bf16: the casts start from the operands' bf16 values
        self.history = {}
        self.step = 0
        self.boundary = []      # step 1: (distance, "layers.i.name operand", scaled value, key)
        self.value_of = {}      # step 1: key -> the run's value it casts (SHARED_INPUTS)
        self.casts = 0          # step 1's casts so far: with an element index, a value's key
        self.pass_now = 0       # the pass of the step in progress ("passes")
        self.flipped = set(flipped)   # step 1's keys cast to the other neighbour (run_flipped)
        self.radius = BOUNDARY_STEPS if radius is None else radius   # what boundary lists

    def cast(self, site, operand, v, scale, block=0):
        """v (fp32; row block `block` of the operand) fake-quantized with scale in the operand's
        format. In step 1 a value within BOUNDARY_STEPS of a midpoint is noted with its key (cast
        number, element) and the value it is (value_of), and a value whose key is in self.flipped
        takes the other of its two neighbouring codes."""
        fmt = self.formats[operand]
        q = fake_quantize(v, scale, fmt)
        if self.step == 1 and operand != "w":
            self.casts += 1
            p = v * scale
            d = boundary_distance(p, fmt).flatten()
            for i in torch.nonzero(d <= self.radius).flatten().tolist():
                key = (self.casts, i)
                self.boundary.append((d[i].item(), f"layers.{site[0]}.{site[1]} {operand}",
                                      p.flatten()[i].item(), key))
                shared = SHARED_INPUTS.get(site[1], site[1]) if operand == "x" else site[1]
                self.value_of[key] = (self.pass_now, site[0], shared, operand, block, i)
                if key in self.flipped:   # the other neighbour: round(2p - q) lies past the midpoint
                    pi = p.flatten()[i:i + 1]
                    alt = round_to_float8(2 * pi - round_to_float8(pi, fmt), fmt)
                    si = (torch.ones_like(v) * scale).flatten()[i]   # this element's scale
                    q.view(-1)[i] = (alt / si)[0]
        return q

    def tensor_scale(self, site, operand, v):
        """The per-tensor scale of fp32 tensor v (operand: its name and row block): from this
        step's amax (tensorwise), or from the largest amax of the history (delayed; the first
        time, this step's), this step's amax then pushed at the front of the history."""
        fmt = self.formats[operand[0]]
        amax = amax_of(v)
        if self.recipe != "delayed":
            return float8_scale(amax, fmt, False)
        hist = self.history.setdefault((site, operand), [])   # operand: (name, row block)
        known = amax
        if hist:
            known = torch.stack(hist).amax()     # amax propagates a NaN, as the run's max does
        hist.insert(0, amax)
        del hist[self.history_len:]
        return float8_scale(known, fmt, False)

    def blocks(self, operand, v):
        """The row blocks an operand is scaled in: an activation (x, dy; rows = the tokens of the
        global batch, sequence by sequence) in activation_groups equal blocks, each data-parallel
        rank's own rows; a weight whole."""
        if operand == "w" or self.groups == 1:
            return [v]
        if v.shape[0] % self.groups:
            raise DumpError(f"{v.shape[0]} tokens do not split into {self.groups} "
                            f"activation groups")
        return list(v.chunk(self.groups, dim=0))

    def tensorwise(self, site, operand, v):
        """v (fp32) cast with one scale per row block, the recipe's."""
        return torch.cat([self.cast(site, operand, b, self.tensor_scale(site, (operand, g), b), g)
                          for g, b in enumerate(self.blocks(operand, v))])

    def rowwise(self, site, operand, v, dim):
        """v (fp32) cast with one power-of-two scale per slice along dim (the contraction) of each
        row block: dim 1 one per row, dim 0 one per column."""
        fmt = self.formats[operand]
        return torch.cat([self.cast(site, operand, b, float8_scale(amax_of(b, dim), fmt, True), g)
                          for g, b in enumerate(self.blocks(operand, v))])


def to_bf16(t):
    """t's values rounded to bf16 (nearest, ties to even: the run rounds its fp32 values), held in
    t's dtype."""
    return t.float().bfloat16().to(t.dtype)


class Bf16Product(torch.autograd.Function):
    """alpha a @ b with --dtype bf16's roundings (docs/design.md, "Parity in bf16"): both operands
    rounded to bf16 forward, and in the backward the incoming gradient with each operand again
    (da = alpha bf16(g) bf16(b)^T, db = alpha bf16(a)^T bf16(g)); the products summed exactly here
    (float64; the run sums in fp32), nothing else rounded: the product and both gradients
    unrounded. Its calls are the run's GEMMs: every linear (bf16_linear) and attention's two
    products, scale q k^T and P v (the softmax and its backward between them unrounded)."""

    @staticmethod
    def forward(ctx, a, b, alpha):
        ab, bb = to_bf16(a.detach()), to_bf16(b.detach())
        ctx.save_for_backward(ab, bb)
        ctx.alpha = alpha
        return alpha * (ab @ bb)

    @staticmethod
    def backward(ctx, g):
        ab, bb = ctx.saved_tensors
        gb = to_bf16(g)
        return ctx.alpha * (gb @ bb.transpose(-2, -1)), ctx.alpha * (ab.transpose(-2, -1) @ gb), None


def bf16_linear(x, W):
    """y = x W^T with --dtype bf16's roundings: x and W rounded forward; dy, W and x backward
    (dx = bf16(dy) bf16(W), dW = bf16(dy)^T bf16(x) over every row of x)."""
    rows = x.reshape(-1, x.shape[-1])
    return Bf16Product.apply(rows, W.T, 1.0).reshape(*x.shape[:-1], W.shape[0])


class Bf16BlockAttention(torch.autograd.Function):
    """Causal attention of q, k, v [B, H, T, hd] in `n` blocks of chunks, as context parallelism
    computes it under bf16 (docs/dump-format.md, attention_blocks): the sequence in n chunks; query
    chunk a against key chunk c <= a, each pair a block: its scores' softmax over its own keys,
    rounded with v for the block's output; the blocks merged exactly by log-sum-exp. Backward as
    FlashAttention's: P from the row's final lse, D = rowsum(bf16(dout) out), dS = P (dP - D)."""

    @staticmethod
    def pairs(T, n):
        Tc = T // n
        for a in range(n):
            for c in range(a + 1):
                # the diagonal block's causal mask (key after query); none below the diagonal
                mask = torch.ones(Tc, Tc, dtype=torch.bool).triu(1) if a == c else None
                yield slice(a * Tc, (a + 1) * Tc), slice(c * Tc, (c + 1) * Tc), mask

    @staticmethod
    def forward(ctx, q, k, v, n):
        scale = 1 / math.sqrt(q.shape[-1])
        qb, kb, vb = to_bf16(q.detach()), to_bf16(k.detach()), to_bf16(v.detach())
        T = q.shape[2]
        outs, lses = {}, {}
        for rows, keys, mask in Bf16BlockAttention.pairs(T, n):
            scores = scale * (qb[..., rows, :] @ kb[..., keys, :].transpose(-2, -1))
            if mask is not None:
                scores = scores.masked_fill(mask, float("-inf"))
            lse = torch.logsumexp(scores, dim=-1, keepdim=True)
            outs.setdefault(rows.start, []).append(to_bf16((scores - lse).exp()) @ vb[..., keys, :])
            lses.setdefault(rows.start, []).append(lse)
        out = torch.empty_like(q)
        lse_all = torch.empty(*q.shape[:-1], 1, dtype=q.dtype)
        for start, parts in outs.items():
            lse = torch.logsumexp(torch.cat(lses[start], dim=-1), dim=-1, keepdim=True)
            rows = slice(start, start + T // n)
            out[..., rows, :] = sum((l - lse).exp() * o for l, o in zip(lses[start], parts))
            lse_all[..., rows, :] = lse
        ctx.save_for_backward(qb, kb, vb, out, lse_all)
        ctx.n, ctx.scale = n, scale
        return out

    @staticmethod
    def backward(ctx, g):
        qb, kb, vb, out, lse = ctx.saved_tensors
        gb = to_bf16(g)
        dq, dk, dv = torch.zeros_like(qb), torch.zeros_like(kb), torch.zeros_like(vb)
        D = (gb * out).sum(-1, keepdim=True)
        for rows, keys, mask in Bf16BlockAttention.pairs(qb.shape[2], ctx.n):
            scores = ctx.scale * (qb[..., rows, :] @ kb[..., keys, :].transpose(-2, -1))
            P = (scores - lse[..., rows, :]).exp()
            if mask is not None:
                P = P.masked_fill(mask, 0.0)
            dP = gb[..., rows, :] @ vb[..., keys, :].transpose(-2, -1)
            dS = to_bf16(P * (dP - D[..., rows, :]))
            dq[..., rows, :] += ctx.scale * (dS @ kb[..., keys, :])
            dk[..., keys, :] += ctx.scale * (dS.transpose(-2, -1) @ qb[..., rows, :])
            dv[..., keys, :] += to_bf16(P).transpose(-2, -1) @ gb[..., rows, :]
        return dq, dk, dv, None


class Float8Linear(torch.autograd.Function):
    """y = x W^T on float8 operands (the module docstring's table): float64 GEMMs of the
    fake-quantized fp32 operands. site = (layer, name)."""

    @staticmethod
    def forward(ctx, x, W, state, site):
        shape = x.shape
        x32 = x.detach().reshape(-1, shape[-1]).float()   # [N, in]: the fp32 values the run casts
        W32 = W.detach().float()                          # [out, in]
        if state.bf16:                                    # or their bf16 values (the high precision)
            x32, W32 = to_bf16(x32), to_bf16(W32)
        if state.recipe == "rowwise":                     # contraction over in: rows of both
            xq, Wq = state.rowwise(site, "x", x32, 1), state.rowwise(site, "w", W32, 1)
        else:
            xq, Wq = state.tensorwise(site, "x", x32), state.tensorwise(site, "w", W32)
        ctx.state, ctx.site, ctx.shape = state, site, shape
        ctx.save_for_backward(x, W, xq, Wq)
        return (xq.double() @ Wq.double().T).to(x.dtype).reshape(*shape[:-1], W.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x, W, xq, Wq = ctx.saved_tensors
        state, site, shape = ctx.state, ctx.site, ctx.shape
        dy32 = dy.reshape(-1, W.shape[0]).float()          # [N, out]
        x32, W32 = x.reshape(-1, shape[-1]).float(), W.float()
        if state.bf16:                                     # rounded again, as the run rounds them
            dy32, x32, W32 = to_bf16(dy32), to_bf16(x32), to_bf16(W32)
        if state.recipe == "rowwise":
            # dx = dy W: contraction over out, dy by rows, W by columns;
            # dW = dy^T x: contraction over the tokens, dy and x by columns
            dyq = state.rowwise(site, "dy", dy32, 1)
            Wq = state.rowwise(site, "w", W32, 0)
            xq = state.rowwise(site, "x", x32, 0)
            dyq_cols = state.rowwise(site, "dy", dy32, 0)
        else:
            # dy cast once; x and W with the forward's scales: the forward's casts xq, Wq
            dyq = state.tensorwise(site, "dy", dy32)
            dyq_cols = dyq
        dx = (dyq.double() @ Wq.double()).to(dy.dtype).reshape(shape)
        dW = (dyq_cols.double().T @ xq.double()).to(dy.dtype)
        return dx, dW, None, None


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


def attention(q, k, v, bf16=False, blocks=0):
    """Causal attention with grouped-query heads.

    q: [B, T, H, hd], k and v: [B, T, Hkv, hd]. Query head h reads kv head h // (H / Hkv):
    repeat_interleave turns kv heads [0, 1] into [0, 0, 1, 1] for H = 4, Hkv = 2.
    Returns [B, T, H * hd]. bf16: both products' operands rounded (Bf16Product), as a bf16 run's;
    blocks: in that many blocks of chunks, as context parallelism under bf16 (Bf16BlockAttention).
    """
    B, T, H, hd = q.shape
    group = H // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))                  # [B, H, T, hd]
    if blocks:
        return Bf16BlockAttention.apply(q, k, v, blocks).transpose(1, 2).reshape(B, T, H * hd)
    scale = 1 / math.sqrt(hd)
    product = (lambda a, b, alpha: Bf16Product.apply(a, b, alpha)) if bf16 else (lambda a, b, alpha: alpha * (a @ b))
    scores = product(q, k.transpose(-2, -1), scale)                   # [B, H, T, T]
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)      # key after query
    scores = scores.masked_fill(future, float("-inf"))
    out = product(scores.softmax(dim=-1), v, 1.0)                     # [B, H, T, hd]
    return out.transpose(1, 2).reshape(B, T, H * hd)


def moe_feed_forward(m, i, params, config, linear, aux):
    """A mixture-of-experts layer's feed-forward output for m [B, T, D] (docs/dump-format.md),
    built from the definition: softmax router (or sigmoid scores), top-k with ties to the lower
    expert, gates the probabilities (the chosen scores over their sum), each copy through its
    expert's SwiGLU, the gated sum (+ the shared expert).
    Appends the layer's balancing term, sum over sequences of T alpha E sum_e f_{s,e} P_{s,e}, to aux."""
    B, T, D = m.shape
    E, k, Fe = config["experts"], config["top_k"], config["expert_dim"]
    x = m.reshape(B * T, D)
    logits = linear(x, "moe.router.gate")                                          # [N, E]
    sigmoid = config.get("router") == "sigmoid"
    # softmax: the probabilities; sigmoid (DeepSeek-V3): each expert's score on its own
    p = torch.sigmoid(logits) if sigmoid else torch.softmax(logits, dim=-1)       # [N, E]
    # top-k: the largest first; among equal probabilities the lower expert (a stable sort)
    order = torch.sort(-p.detach(), dim=-1, stable=True).indices[:, :k]           # [N, k]
    gates = p.gather(1, order)                                                    # [N, k]
    if sigmoid:   # the chosen scores over their sum
        gates = gates / gates.sum(-1, keepdim=True)
    # a capacity: each expert takes the first C = ceil(c T k / E) copies of each sequence, in
    # token order (a token's copies in j order); the others are dropped (no output, no gradient)
    kept = torch.ones_like(order, dtype=torch.bool)
    if config.get("capacity_factor", 0) > 0:
        cx = config["capacity_factor"] * T * k / E   # within 1e-6 of an integer: that integer (moe_capacity)
        C = round(cx) if abs(round(cx) - cx) <= 1e-6 * cx else math.ceil(cx)
        onehot = F.one_hot(order.reshape(B, T * k), E)                            # [B, T k, E]
        rank_in_expert = (onehot.cumsum(1) - 1).gather(2, order.reshape(B, T * k, 1))
        kept = (rank_in_expert < C).reshape(B * T, k)
    out = torch.zeros_like(x)
    w1, w2, w3 = (params[f"layers.{i}.moe.experts.{n}"] for n in ("w1", "w2", "w3"))
    for e in range(E):
        rows, slots = ((order == e) & kept).nonzero(as_tuple=True)                # copies sent to e
        if rows.numel() == 0:
            continue
        xe = x[rows]
        a = linear(xe, None, "", w1[e * Fe:(e + 1) * Fe])
        b = linear(xe, None, "", w3[e * Fe:(e + 1) * Fe])
        y = linear(F.silu(a) * b, None, "", w2[e * D:(e + 1) * D])
        out = out.index_add(0, rows, gates[rows, slots][:, None] * y)
    if config["shared_expert"]:
        out = out + linear(F.silu(linear(x, "moe.shared_expert.w1")) * linear(x, "moe.shared_expert.w3"),
                           "moe.shared_expert.w2")
    # the balancing loss: f a count (no gradient), P the mean probability (sigmoid: of each token's
    # scores over their sum), per sequence
    f = F.one_hot(order, E).sum(1).reshape(B, T, E).sum(1).to(p.dtype) / (k * T)   # [B, E]
    shares = p / p.sum(-1, keepdim=True) if sigmoid else p
    P = shares.reshape(B, T, E).mean(1)                                           # [B, E]
    aux.append((T * config["aux_alpha"] * E * (f * P).sum(-1)).sum())
    return out.reshape(B, T, D)


def forward(params, config, tokens, float8=None, aux=None):
    """logits [B, T, V] of the Llama of docs/dump-format.md; params maps torchtitan names to tensors.
    float8: a Float8State, whose linears then run on float8 operands (Float8Linear). aux: a list
    that receives each mixture-of-experts layer's balancing term (dump-format.md)."""
    B, T = tokens.shape
    H, Hkv = config["n_heads"], config["n_kv_heads"]
    hd = config["dim"] // H
    eps, theta = config["norm_eps"], config["rope_theta"]

    h = params["tok_embeddings.weight"][tokens]                       # [B, T, D]
    for i in range(config["n_layers"]):
        def w(name):
            return params[f"layers.{i}.{name}.weight"]

        def linear(x, name, suffix=".weight", weight=None):
            # x W^T, W = layers.i.<name><suffix> (or `weight`); float8 if the run's was
            W = weight if weight is not None else params[f"layers.{i}.{name}{suffix}"]
            short = name.split(".")[-1] if name else ""
            if float8 is not None and short in float8.linears:
                return Float8Linear.apply(x, W, float8, (i, short))
            if config.get("bf16"):
                return bf16_linear(x, W)
            return x @ W.T

        # attention block: h += wo(attention(rope(wq n), rope(wk n), wv n)),  n = rmsnorm(h)
        n = rmsnorm(h, w("attention_norm"), eps)
        q = linear(n, "attention.wq").view(B, T, H, hd)
        k = linear(n, "attention.wk").view(B, T, Hkv, hd)
        v = linear(n, "attention.wv").view(B, T, Hkv, hd)
        h = h + linear(attention(rope(q, theta), rope(k, theta), v, bool(config.get("bf16")),
                                 config.get("attention_blocks", 0)), "attention.wo")

        # feed-forward block: h += w2(silu(w1 m) * w3 m),  m = rmsnorm(h); or the experts'
        m = rmsnorm(h, w("ffn_norm"), eps)
        if is_moe(config, i):
            h = h + moe_feed_forward(m, i, params, config, linear, aux if aux is not None else [])
            continue
        h = h + linear(F.silu(linear(m, "feed_forward.w1")) * linear(m, "feed_forward.w3"),
                       "feed_forward.w2")

    out = rmsnorm(h, params["norm.weight"], eps)
    if config.get("bf16"):   # the output layer is a linear too (never a float8 one)
        return bf16_linear(out, params["output.weight"])
    return out @ params["output.weight"].T


def rows_backward(params, config, tokens, targets, count, float8=None):
    """One forward-backward pass over some of the step's rows: the sum of their token losses
    divided by `count`, the valid targets of the whole step, its gradients accumulated into
    params' .grad; returns that loss."""
    logits = forward(params, config, tokens, float8)
    V = logits.shape[-1]
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=IGNORE_INDEX,
                           reduction="sum") / count
    loss.backward()
    return loss.item()


def step_loss(params, config, tokens, targets, float8=None):
    """The step's loss, its gradients accumulated into params' .grad (autograd). A float8 run
    with "passes" P > 1 (chapter 08's --accum) made P forward-backward passes, one per equal block
    of the batch's rows in order, each on its own float8 casts (the delayed histories record
    every pass), the loss of each pass divided by the valid targets of the whole step: so does
    this. Otherwise one pass, mean_loss of the whole batch."""
    passes = float8.passes if float8 is not None else 1
    if passes == 1:
        aux = []   # a mixture of experts' balancing terms, divided by the same count as the loss
        loss = mean_loss(forward(params, config, tokens, float8, aux), targets)
        if aux:
            loss = loss + sum(aux) / max(int((targets != IGNORE_INDEX).sum()), 1)
        loss.backward()
        return loss.item()
    if tokens.shape[0] % passes:
        raise DumpError(f"{tokens.shape[0]} sequences do not split into {passes} passes")
    count = max(int((targets != IGNORE_INDEX).sum()), 1)
    total = 0.0
    for k, (t, y) in enumerate(zip(tokens.chunk(passes), targets.chunk(passes))):
        float8.pass_now = k
        total += rows_backward(params, config, t, y, count, float8)
    return total


def read_reduce(options, path):
    """The gradients' reduction of run_options (--reduce-dtype bf16, chapters 04 and 08), checked:
    {"dtype": "bf16", "data_ranks": N}; None when absent (summed in fp32, as the reference does)."""
    r = options.get("reduce")
    if r is None:
        return None
    if not isinstance(r, dict) or r.get("dtype") != "bf16" or not isinstance(r.get("data_ranks"), int) \
            or r["data_ranks"] < 1 or set(r) - {"dtype", "data_ranks", "passes", "microbatches"} \
            or any(not isinstance(r.get(k, 1), int) or r.get(k, 1) < 1 for k in ("passes", "microbatches")):
        raise DumpError(f"{path}: run_options.reduce is {r!r}, expected {{\"dtype\": \"bf16\", "
                        f"\"data_ranks\": N >= 1[, \"passes\": P >= 1][, \"microbatches\": M >= 1]}}")
    return r


def step_loss_reduced(params, config, tokens, targets, reduce):
    """The step's loss and gradients as --reduce-dtype bf16 sums them. The batch's rows are
    reduce["passes"] (default 1) equal blocks in order (chapter 08's --accum), each split in
    reduce["data_ranks"] equal blocks in order (data rank r's share), each of those in
    reduce["microbatches"] (default 1) equal blocks (a pipeline's microbatches). Every (pass,
    microbatch) is one reduction: each rank's gradient of its rows (of the global mean loss,
    divided by the valid targets of the whole step) rounded to bf16, the ranks' sum rounded to
    bf16 once; the reductions then add up in full precision (the run: in its fp32 gradient shards).
    What this leaves out: the run rounds its partial sums too, at each of the collective's combining
    steps in the library's order, and partial gradients that a later sum completes (the norms'
    gradients split over tp under sequence parallelism, a cp rank's share of each sequence) are
    rounded before that sum. Each is one rounding more of the same size, inside the bf16 tolerance."""
    ranks, passes, micro = reduce["data_ranks"], reduce.get("passes", 1), reduce.get("microbatches", 1)
    if tokens.shape[0] % (ranks * passes * micro):
        raise DumpError(f"{tokens.shape[0]} sequences do not split into {passes} pass(es) over {ranks} data "
                        f"ranks of {micro} microbatch(es)")
    count = max(int((targets != IGNORE_INDEX).sum()), 1)
    # rows[a][r][m]: pass a, data rank r, microbatch m
    rows = [[list(zip(t.chunk(micro), y.chunk(micro))) for t, y in zip(tp.chunk(ranks), yp.chunk(ranks))]
            for tp, yp in zip(tokens.chunk(passes), targets.chunk(passes))]
    total, summed = 0.0, {name: torch.zeros_like(p) for name, p in params.items()}
    for a in range(passes):
        for m in range(micro):
            reduced = {name: torch.zeros_like(p) for name, p in params.items()}
            for r in range(ranks):
                t, y = rows[a][r][m]
                for p in params.values():
                    p.grad = None
                total += rows_backward(params, config, t, y, count)
                for name, p in params.items():
                    if p.grad is not None:
                        reduced[name] += to_bf16(p.grad)
            for name in params:
                summed[name] += to_bf16(reduced[name])
    for name, p in params.items():
        p.grad = summed[name]
    return total


def mean_loss(logits, targets):
    """Sum of token cross-entropies over targets != -100, divided by their count."""
    V = logits.shape[-1]
    total = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1),
                            ignore_index=IGNORE_INDEX, reduction="sum")
    count = int((targets != IGNORE_INDEX).sum())
    return total / max(count, 1)          # an all-padding batch: an empty sum, loss 0


# ---------------------------------------------------------------------------- comparing
def relative_diff(got, ref, norm=np.inf):
    """|got - ref| / |ref| in the max norm (the parity metric of docs/design.md) or, norm=2, the l2
    norm; 0/0 = 0."""
    diff = float(np.linalg.norm((got - ref).ravel(), norm)) if got.size else 0.0
    scale = float(np.linalg.norm(ref.ravel(), norm)) if ref.size else 0.0
    if scale == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / scale


def step1_replay(init, config, f8, directory, flipped, radius=None):
    """Step 1 again, from the dump's parameters, with the step-1 values of `flipped` (keys of
    Float8State.boundary) cast to their other neighbouring code: its gradients, its loss, and the
    state, whose boundary lists the values next to a midpoint in this replay."""
    params = {name: torch.tensor(array, dtype=DTYPE, requires_grad=True) for name, array in init.items()}
    batch, _ = read_safetensors(os.path.join(directory, "batch_1.safetensors"))
    tokens = torch.from_numpy(batch["tokens"].astype(np.int64))
    targets = torch.from_numpy(batch["targets"].astype(np.int64))
    state = Float8State(f8, flipped, radius)
    state.step = 1
    loss = step_loss(params, config, tokens, targets, state)
    return {name: p.grad.detach().numpy() for name, p in params.items()}, loss, state


def explain_by_boundaries(init, config, f8, directory, c_grads, c_loss, candidates, value_of):
    """A float8 dump whose step 1 misses the tolerance (its gradients, or its loss): is the
    difference one of rounding ties? The values nearest a midpoint (at most FLIP_TRIES of them,
    each with every cast of it) are cast to their other neighbour: one at a time, every pair, every
    three of the six nearest, then the nearest four, five, ... together; then chains, each flip
    followed by the new ties it created (CHAIN_WIDTH, CHAIN_DEPTH). The first set after which every
    step-1 gradient and the step-1 loss are within the tolerances is returned with that loss
    ((values, loss), or None if no set explains it). Only values that lie within BOUNDARY_STEPS of
    a midpoint are tried: the run, whose fp32 inputs differ in their last bits, may have rounded
    exactly those the other way."""
    # One value may be cast several times in step 1 (rowwise casts dy and x along rows, then
    # along columns; wq, wk and wv cast the same input, and so do w1 and w3): the run rounded all
    # of its casts from the same fp32 input, so they flip together (value_of: the value a cast
    # element is, by pass, layer, tensor, row block and element).
    def grouped(cands, values_of):
        groups = {}
        for c in sorted(cands):
            groups.setdefault(values_of[c[3]], []).append(c)
        return sorted(groups.values(), key=lambda g: g[0][0])

    tried = {}
    def attempt(chain):   # chain: groups of casts; -> (ok, error, loss, state), each set replayed once
        keys = frozenset(c[3] for g in chain for c in g)
        if keys not in tried:
            grads, loss, state = step1_replay(init, config, f8, directory, keys, CHAIN_BOUNDARY_STEPS)
            error = max(relative_diff(c_grads[n].astype(np.float64), g) for n, g in grads.items())
            ok = error <= GRAD_RTOL and (c_loss is None or abs(c_loss - loss) <= LOSS_RTOL * max(1.0, abs(loss)))
            tried[keys] = (ok, error, loss, state)
        return tried[keys]

    near = grouped(candidates, value_of)[:FLIP_TRIES]
    tries = ([list(t) for k in (1, 2) for t in itertools.combinations(near, k)]          # singles, pairs
             + [list(t) for t in itertools.combinations(near[:6], 3)]                    # triples of the 6 nearest
             + [near[:k] for k in range(4, len(near) + 1)])                              # then the nearest k
    for t in tries:
        ok, _, loss, _ = attempt(t)
        if ok:
            return [c for g in t for c in g], loss
    # Chained ties, a beam search: from the CHAIN_WIDTH single flips that bring the gradients
    # nearest the run's, add each of the CHAIN_CANDIDATES values nearest a midpoint in that replay,
    # and keep the CHAIN_WIDTH sets nearest the run's that are nearer than the set they grew from.
    frontier = sorted(([g] for g in near), key=lambda chain: attempt(chain)[1])[:CHAIN_WIDTH]
    for _ in range(CHAIN_DEPTH):
        grown = []
        for chain in frontier:
            ok, error, _, state = attempt(chain)
            flipped = {c[3] for g in chain for c in g}
            for g in [g for g in grouped(state.boundary, state.value_of)
                      if not any(c[3] in flipped for c in g)][:CHAIN_CANDIDATES]:
                ok, e, loss, _ = attempt(chain + [g])
                if ok:
                    return [c for h in chain + [g] for c in h], loss
                if e < error:
                    grown.append((e, chain + [g]))
        frontier = [chain for _, chain in sorted(grown, key=lambda x: x[0])[:CHAIN_WIDTH]]
    return None


def run(directory):
    init, metadata = read_safetensors(os.path.join(directory, "init.safetensors"))
    config = read_config(metadata, os.path.join(directory, "init.safetensors"))
    options = read_run_options(metadata, os.path.join(directory, "init.safetensors"))
    f8 = read_float8(options, os.path.join(directory, "init.safetensors"))
    reduce = read_reduce(options, os.path.join(directory, "init.safetensors"))
    if f8 is not None:   # float8's high precision: the run's dtype (REFERENCE_FLOAT8_FROM=fp32: casts
        # from the unrounded values whatever the dtype, t_dump_torch's proof that the rounding before
        # the casts is what a float8 dump in bf16 is judged on)
        f8["bf16"] = bool(config.get("bf16")) and os.environ.get("REFERENCE_FLOAT8_FROM") != "fp32"
    if reduce is not None and (f8 is not None or "experts" in config):
        raise DumpError(f"{directory}: run_options.reduce with float8 or experts: not replayed by this script")
    check_tensors(init, config, os.path.join(directory, "init.safetensors"))
    losses, lrs = read_losses(os.path.join(directory, "losses.txt"))
    steps = batch_steps(directory)
    grads_path = os.path.join(directory, "grads_1.safetensors")
    c_grads = None
    if os.path.exists(grads_path):
        c_grads = read_safetensors(grads_path)[0]
        check_tensors(c_grads, config, grads_path)

    # the tolerances: fp32's, or bf16's (docs/design.md, "Parity in bf16"): the run rounds the
    # GEMM operands from fp32 values, this replay from float64 ones; where the two straddle a
    # rounding boundary they differ by one bf16 ulp (2u, u = 2^-8), which cascades through the
    # GEMMs to a fixed point of about 2u: twice that, 4u, per gradient, and 4u / sqrt(tokens) for
    # the loss, a mean over the tokens
    loss_rtol, grad_rtol = LOSS_RTOL, GRAD_RTOL
    if config.get("bf16"):
        tokens_per_step = read_safetensors(os.path.join(directory, "batch_1.safetensors"))[0]["tokens"].size
        loss_rtol, grad_rtol = 4 * BF16_U / math.sqrt(tokens_per_step), 4 * BF16_U
    print(f"reference_torch: {directory}, {len(steps)} steps, {len(init)} tensors, "
          f"reference in {str(DTYPE).replace('torch.', '')}")
    print("  config: " + ", ".join(f"{k} {v:g}" if not isinstance(v, str) else f"{k} {v}"
                                   for k, v in config.items() if k not in ("bf16", "attention_blocks")))
    if config.get("bf16"):
        print(f"  mixed precision: bf16 GEMM operands (every linear, the output layer's too, and attention's"
              + (f"; attention in {config['attention_blocks']} blocks, as context parallelism"
                 if config.get("attention_blocks") else "")
              + ("; float8's casts from those bf16 values" if f8 is not None else "")
              + f"), fp32 elsewhere; tolerances loss {loss_rtol:.2e}, gradients {grad_rtol:.2e}")
    if reduce is not None:
        print(f"  gradients summed in bf16 over {reduce['data_ranks']} data rank(s), "
              f"{reduce.get('passes', 1)} pass(es) x {reduce.get('microbatches', 1)} microbatch(es) a step "
              f"reduced apart: each rank's share rounded to bf16, the sum rounded once (step_loss_reduced)")
    if "experts" in config:
        print(f"  mixture of experts: {config['experts']} experts of hidden {config['expert_dim']}, top-"
              f"{config['top_k']}{', a shared expert' if config['shared_expert'] else ''}, balancing loss "
              f"alpha {config['aux_alpha']:g}, "
              + (f"capacity factor {config['capacity_factor']:g}" if "capacity_factor" in config else "dropless")
              + (", sigmoid router (the gates the chosen scores over their sum)" if config.get("router") == "sigmoid" else "")
              + (f"; on one layer in {config['moe_every']}, Llama's feed-forward on the others"
                 if config.get("moe_every", 1) > 1 else ""))
    float8 = None
    failures = 0
    if f8 is not None:
        float8 = Float8State(f8)
        print(f"  float8: {f8['recipe']}"
              + (f" (amax history {f8['amax_history']})" if f8["recipe"] == "delayed" else "")
              + f", x {f8['formats']['x']}, W {f8['formats']['w']}, dy {f8['formats']['dy']}; "
              + " ".join(n for n in FLOAT8_LINEARS if n in f8["linears"]) + " of every layer")
        problems = check_float8_arithmetic()
        failures += len(problems)
        for p in problems:
            print(f"  float8 arithmetic wrong: {p}  FAIL")

    # The parameters, as float64 leaves in the file's order, and the optimizer over them.
    params = {name: torch.tensor(array, dtype=DTYPE, requires_grad=True)
              for name, array in init.items()}
    optimizer = torch.optim.AdamW(params.values(), lr=config["lr"],
                                  betas=(config["beta1"], config["beta2"]),
                                  eps=config["eps"], weight_decay=config["weight_decay"])

    loss1_ok = True
    print(f"\n  {'step':>4} {'loss (dump)':>14} {'loss (torch)':>14} {'|diff|':>10}  verdict")
    for step in steps:
        batch, _ = read_safetensors(os.path.join(directory, f"batch_{step}.safetensors"))
        tokens = torch.from_numpy(batch["tokens"].astype(np.int64))
        targets = torch.from_numpy(batch["targets"].astype(np.int64))

        optimizer.zero_grad(set_to_none=True)
        if float8 is not None:
            float8.step = step
        if reduce is not None:
            ref = step_loss_reduced(params, config, tokens, targets, reduce)
        else:
            ref = step_loss(params, config, tokens, targets, float8)
        if step in losses:
            got = losses[step]
            ok = abs(got - ref) <= loss_rtol * max(1.0, abs(ref))
            if step == 1 and float8 is not None:   # judged with the gradients (rounding ties), below
                loss1_ok, loss1 = ok, (got, ref)
                verdict = "ok" if ok else "beyond: judged below, with the gradients"
            elif float8 is None or step == 1:
                failures += not ok
                verdict = "ok" if ok else "FAIL"
            else:
                verdict = f"{FLOAT8_LATER_LOSSES} ({'within' if ok else 'beyond'} {loss_rtol:g})"
            print(f"  {step:>4} {got:>14.9g} {ref:>14.9g} {abs(got - ref):>10.3e}  {verdict}")
        else:
            failures += 1
            print(f"  {step:>4} {'(missing)':>14} {ref:>14.9g} {'':>10}  FAIL")

        if step == 1 and c_grads is not None:
            grad_table = [(name, p.grad.detach().clone().numpy()) for name, p in params.items()]
        if "clip_grad_norm" in config:
            torch.nn.utils.clip_grad_norm_(list(params.values()), config["clip_grad_norm"])
        if lrs:   # a scheduled learning rate: the one this step's update used
            if step not in lrs:
                raise DumpError(f"losses.txt: step {step} has no learning rate, the other steps do")
            for group in optimizer.param_groups:
                group["lr"] = lrs[step]
        optimizer.step()

    if float8 is not None:
        if len(steps) > 1:
            print(f"  losses after step 1: {FLOAT8_LATER_LOSSES}: after an AdamW step the run's "
                  f"and the replay's parameters differ in their last bits, and a float8 cast of a "
                  f"value next to a rounding boundary turns that into a whole float8 step")

    if c_grads is None:
        failures += 1 + (float8 is not None and 1 in losses and not loss1_ok)
        print(f"\n  {grads_path}: missing, step-1 gradients not compared  FAIL")
    else:
        # float8 over bf16: judged in the l2 norm (FLOAT8_OVER_BF16), the max norm shown
        l2 = float8 is not None and float8.bf16
        if l2:
            print(f"\n  step-1 gradients: |dump - torch| / |torch| per tensor in the l2 norm (tolerance "
                  f"{grad_rtol:g}; {FLOAT8_OVER_BF16}), the max norm shown")
            print(f"  {'tensor':<36} {'max|torch|':>12} {'max norm':>12} {'l2 norm':>12}  verdict")
        else:
            print(f"\n  step-1 gradients: max|dump - torch| / max|torch| per tensor "
                  f"(tolerance {grad_rtol:g})")
            print(f"  {'tensor':<36} {'max|torch|':>12} {'rel diff':>12}  verdict")
        grad_failures = 0
        for name, ref in grad_table:
            rel = relative_diff(c_grads[name].astype(np.float64), ref)
            rel2 = relative_diff(c_grads[name].astype(np.float64), ref, 2) if l2 else None
            ok = (rel2 if l2 else rel) <= grad_rtol
            grad_failures += not ok
            print(f"  {name:<36} {np.max(np.abs(ref)):>12.4e} {rel:>12.3e} "
                  + (f"{rel2:>12.3e} " if l2 else "") + f" {'ok' if ok else 'beyond'}")
        explained = None
        loss1_failed = float8 is not None and 1 in losses and not loss1_ok
        # (the search flips float8 codes of values next to a midpoint, fp32's ties; a float8 dump in
        # bf16, judged at bf16's tolerances, has no such search: FLOAT8_OVER_BF16)
        if (grad_failures or loss1_failed) and float8 is not None and float8.boundary and not float8.bf16:
            explained = explain_by_boundaries(init, config, f8, directory, c_grads,
                                              losses.get(1), float8.boundary, float8.value_of)
        what = " and ".join(x for x in (f"{grad_failures} tensor(s) beyond {grad_rtol:g}" if grad_failures else "",
                                          f"step 1's loss beyond {loss_rtol:g}" if loss1_failed else "") if x)
        if explained:
            values, loss = explained
            print(f"  {what}: explained by rounding ties. With {len(values)} step-1 value(s) next to a "
                  f"midpoint cast to the other neighbouring code, as the run's fp32 input (different in its "
                  f"last bits) may have, every step-1 gradient is within {grad_rtol:g} and step 1's loss is "
                  f"{loss:.9g} (the dump's {losses[1]:.9g}, |diff| {abs(loss - losses[1]):.3e}): ok")
            for d, where, p, _ in values:
                print(f"    {where}: scaled value {p!r}, {d:.3g} of a float8 step from the midpoint")
        else:
            failures += grad_failures + loss1_failed
            if what:
                print(f"  {what}  FAIL")

    if float8 is not None:
        near = sorted(float8.boundary)
        ties = sum(1 for d, _, _, _ in near if d == 0)
        print(f"\n  float8, step 1: {len(near)} activation value(s) cast within {BOUNDARY_STEPS:g} "
              f"of a float8 step of a rounding midpoint ({ties} exact ties): their code depends on "
              f"the last bits of the fp32 input, and one that the run rounded the other way moves "
              f"the step-1 gradients by a float8 step" + (". The nearest:" if near else ""))
        for d, where, p, _ in near[:3]:
            print(f"    {where}: scaled value {p!r}, {d:.3g} of a step from the midpoint")

    print(f"\nreference_torch: {'PASS' if failures == 0 else f'FAIL ({failures} failed)'}")
    return 0 if failures == 0 else 1


def check_one(directory):
    if not os.path.isdir(directory):
        print(f"reference_torch: {directory} is not a directory", file=sys.stderr)
        return 2
    try:
        return run(directory)
    except DumpError as e:
        print(f"reference_torch: {e}", file=sys.stderr)
        return 2


def main(argv):
    if len(argv) < 2:
        print(f"usage: {argv[0]} DUMP_DIR [DUMP_DIR...]   (directories written by a chapter's --dump)",
              file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    if len(argv) == 2:
        return check_one(argv[1])
    worst = 0
    for directory in argv[1:]:
        report = os.path.join(directory, "reference.txt") if os.path.isdir(directory) else os.devnull
        with open(report, "w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
            try:
                status = check_one(directory)
            except Exception:   # one dump's crash is its failure, not the batch's
                traceback.print_exc()
                status = 2
        print(f"{directory} {status}", flush=True)
        worst = max(worst, status)
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv))
