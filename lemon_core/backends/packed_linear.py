"""oneDNN-packed linear layers: the CPU backend's decode speed at batch sizes above one.

Why: a decoding step multiplies a few rows (one per sequence of the batch) by every weight matrix.
torch's dense ``F.linear`` on CPU hands that to MKL's sgemm, which re-packs the whole weight matrix on
every call; at 8-32 rows that packing, not the arithmetic, is the step's cost. oneDNN's linear reads a
weight converted once to its own layout (``Tensor.to_mkldnn``). Measured on this project's 2-core AVX2
machine, Qwen2.5-Coder-0.5B fp32, one decoding step over a 300-token cache (``bench/engines.py`` has the
end-to-end figures):

    rows per step      1        8        32
    dense F.linear   205 ms   935 ms   1280 ms
    packed (this)    186 ms   409 ms    792 ms

Logits agree to ~1e-4 (a different summation order). Memory: the packed weights are anonymous memory
(2.2 GiB for that model, the output head's packed copy included, as the embedding it is tied to stays
dense); the pages of the mmapped safetensors file read while packing also count in RSS (1.9 GiB) but are
clean file pages the kernel drops under pressure. Inference only: the packed weight is a buffer, not a
``Parameter``, so nothing can train it; a model that trains (the orchestrator policy) keeps dense layers.
"""

from __future__ import annotations

import torch
from torch import nn


class PackedLinear(nn.Module):
    """``nn.Linear``'s forward on a weight held in oneDNN's layout (fp32, CPU, no grad)."""

    def __init__(self, dense: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = dense.in_features, dense.out_features
        self.weight_packed = dense.weight.detach().float().to_mkldnn()
        self.bias_packed = dense.bias.detach().float().to_mkldnn() if dense.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).contiguous().to_mkldnn()
        out = torch._C._nn.mkldnn_linear(rows, self.weight_packed, self.bias_packed).to_dense()
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=onednn"


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Packing applies to fp32 models on a CPU whose torch build has oneDNN (every x86/arm wheel)."""
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


def pack_linear_layers(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` of ``model`` by a ``PackedLinear``, in place; returns how many.

    A layer whose weight is tied to another module (e.g. an output head sharing the embedding) gets its
    own packed copy; the embedding keeps the dense one.
    """
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, PackedLinear(child))
                count += 1
    return count
