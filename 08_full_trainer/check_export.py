"""check_export.py EXPORT DATA BATCH N_BATCHES VAL_LOSS: the exported model, loaded into another
framework (tests/reference_torch.py's Llama, PyTorch, float64), gives the validation loss the
trainer printed.

The validation batches are the trainer's (common/harness/data.h): the last 10% of the file's
bytes (from n // 10 * 9), batch k row b the window of seq_len + 1 bytes at (k * B + b) * seq_len.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import numpy as np
import torch
import reference_torch as ref


def main(argv):
    export, data, batch, n_batches, printed = argv[1], argv[2], int(argv[3]), int(argv[4]), float(argv[5])
    tensors, metadata = ref.read_safetensors(export)
    ints = ["dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "seq_len"]
    config = {k: int(metadata[k]) for k in ints}
    config.update({k: float(metadata[k]) for k in ["norm_eps", "rope_theta"]})
    ref.check_tensors(tensors, config, export)   # the baseline's names and PyTorch's shapes
    params = {name: torch.tensor(array, dtype=ref.DTYPE) for name, array in tensors.items()}
    raw = np.frombuffer(open(data, "rb").read(), dtype=np.uint8)
    val = raw[len(raw) // 10 * 9:].astype(np.int64)
    T = config["seq_len"]
    total = 0.0
    with torch.no_grad():
        for k in range(n_batches):
            starts = [(k * batch + b) * T for b in range(batch)]
            windows = torch.from_numpy(np.stack([val[s:s + T + 1] for s in starts]))
            total += ref.mean_loss(ref.forward(params, config, windows[:, :T]), windows[:, 1:]).item()
    loss = total / n_batches
    diff = abs(loss - printed) / abs(loss)
    ok = diff <= 1e-5
    print(f"export {os.path.basename(export)}: {len(tensors)} tensors; validation loss in PyTorch {loss:.6f}, "
          f"the trainer's {printed:.6f}, {diff:.1e} relative: {'ok' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
