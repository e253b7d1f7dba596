"""bench_baseline.py STEPS DIM LAYERS HEADS FFN VOCAB SEQ BATCH [bf16]: PyTorch's time for the
single-device step of tests/reference_torch.py's Llama (the same model as the C baseline) in float32
(or, with bf16, under torch.autocast("cpu", torch.bfloat16): bf16 matmuls, fp32 parameters): forward,
cross-entropy, backward and torch.optim.AdamW, one thread (the caller pins OpenBLAS too). Prints
"pytorch ms per step: X" (the mean of STEPS steps after one warm-up step) and "gemm probe GFLOP/s: Y"
(torch.mm of 512 x 512 matrices, the machine's single-core GEMM rate through the same BLAS)."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))  # reference_torch.py
import torch
import reference_torch as ref


def main(argv):
    steps, D, L, H, F, V, T, B = (int(a) for a in argv[1:9])
    bf16 = len(argv) > 9 and argv[9] == "bf16"
    torch.set_num_threads(1)
    torch.manual_seed(0)
    hd = D // H
    config = {"dim": D, "n_layers": L, "n_heads": H, "n_kv_heads": H, "ffn_dim": F, "vocab_size": V,
              "seq_len": T, "norm_eps": 1e-5, "rope_theta": 10000.0}
    shapes = {"tok_embeddings.weight": (V, D), "norm.weight": (D,), "output.weight": (V, D)}
    for i in range(L):
        shapes.update({f"layers.{i}.attention_norm.weight": (D,), f"layers.{i}.ffn_norm.weight": (D,),
                       f"layers.{i}.attention.wq.weight": (H * hd, D), f"layers.{i}.attention.wk.weight": (H * hd, D),
                       f"layers.{i}.attention.wv.weight": (H * hd, D), f"layers.{i}.attention.wo.weight": (D, H * hd),
                       f"layers.{i}.feed_forward.w1.weight": (F, D), f"layers.{i}.feed_forward.w2.weight": (D, F),
                       f"layers.{i}.feed_forward.w3.weight": (F, D)})
    params = {n: (torch.ones(s) if len(s) == 1 else torch.randn(s) * 0.02).requires_grad_() for n, s in shapes.items()}
    opt = torch.optim.AdamW(params.values(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    tokens = torch.randint(0, V, (B, T + 1))

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = ref.forward(params, config, tokens[:, :T])
        loss = ref.mean_loss(logits.float(), tokens[:, 1:])
        loss.backward()
        opt.step()

    step()   # warm-up: allocations, threads
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    print(f"pytorch ms per step: {1e3 * (time.perf_counter() - t0) / steps:.1f}")
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    torch.mm(a, b)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.25:
        torch.mm(a, b)
        n += 1
    print(f"gemm probe GFLOP/s: {2 * 512 ** 3 * n / (time.perf_counter() - t0) / 1e9:.1f}")


if __name__ == "__main__":
    main(sys.argv)
