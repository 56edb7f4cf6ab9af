"""oneDNN-packed linear layers: the CPU backend's decode speed at batch sizes above one.

Why: a decoding step multiplies a few rows (one per sequence of the batch) by every weight matrix.
torch's dense ``F.linear`` on CPU hands that to MKL's sgemm, which re-packs the whole weight matrix on
every call; at 8-32 rows that packing, not the arithmetic, is the step's cost. oneDNN's linear reads a
weight reordered once into its own layout. Measured on this project's 2-core AVX2 machine, Qwen2.5-Coder-0.5B
fp32, one decoding step over a 300-token cache (``bench/engines.py`` has the end-to-end figures):

    rows per step      1        8        32
    dense F.linear   205 ms   935 ms   1280 ms
    packed           186 ms   409 ms    792 ms

A first version converted every activation into oneDNN's tensor type and back (``to_mkldnn``/``to_dense``);
the op used now reads and writes ordinary tensors. On the AVX-512 2-core machine, one layer's seven
projections plus the output head at 32 rows (weights in cache): 59.0 ms with the conversions, 50.0 ms
without; dense ``F.linear`` 84.0 ms.

Logits agree to ~1e-4 (a different summation order). Memory: the packed weights are anonymous memory
(2.2 GiB for that model, the output head's packed copy included, as the embedding it is tied to stays
dense); the pages of the mmapped safetensors file read while packing also count in RSS (1.9 GiB) but are
clean file pages the kernel drops under pressure. Inference only: the packed weight is a buffer, not a
``Parameter``, so nothing can train it; a model that trains (the orchestrator policy) keeps dense layers.
"""

from __future__ import annotations

import torch
from torch import nn

# The batch size oneDNN tunes the packed layout for. Decoding runs 1-32 rows a step (the backend's
# max_batch_size is 16 or 32); measured on the AVX-512 machine, a layout packed for 32 rows is as fast as one
# packed for 1 at a single row and 30% faster at 7-32 rows, and the layout stays valid for any row count.
PACK_FOR_ROWS = 32


class PackedLinear(nn.Module):
    """``nn.Linear``'s forward on a weight held in oneDNN's layout (fp32, CPU, no grad).

    Activations stay ordinary dense tensors: ``mkldnn::_linear_pointwise`` (the op torch's own compiler
    emits for a frozen CPU linear) reads them directly, so no step pays a conversion of its activations
    into and out of oneDNN's tensor type (that round trip was 10% of a decoding step).
    """

    def __init__(self, dense: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = dense.in_features, dense.out_features
        weight = dense.weight.detach().float().contiguous()
        self.weight_packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_FOR_ROWS)
        self.bias = dense.bias.detach().float().contiguous() if dense.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:  # the op has no backward: a gradient would be lost
            raise RuntimeError("PackedLinear is inference-only; train a model with dense nn.Linear layers")
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.weight_packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=onednn"


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Packing applies to fp32 models on a CPU whose torch build has oneDNN (every x86/arm wheel)."""
    return (
        device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


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
