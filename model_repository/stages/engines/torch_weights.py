"""A checkpoint's tensors as the torch engine's architectures take them: read from model.safetensors (or
pytorch_model.bin), the task model's prefix stripped, each put on the device in the dtype its block computes in."""

from __future__ import annotations

from pathlib import Path

import torch

from .torch_ops import Norm


def load_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    path = model_dir / "model.safetensors"
    if path.is_file():
        from safetensors.torch import load_file

        raw = load_file(str(path), device="cpu")
    elif (model_dir / "pytorch_model.bin").is_file():
        raw = torch.load(model_dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"{model_dir} holds neither model.safetensors nor pytorch_model.bin")
    # Old TensorFlow-converted checkpoints name LayerNorm parameters gamma and beta.
    return {name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias"): tensor
            for name, tensor in raw.items()}  # fmt: skip


class Weights:
    """The checkpoint's tensors by name. A task model keeps its encoder under a prefix ("bert.", "roberta.") and
    its head beside it; a sentence-transformers folder has the bare encoder: names are looked up without the
    prefix first, then with it. A missing tensor is an error naming it."""

    def __init__(self, state: dict[str, torch.Tensor], prefix: str, device, dtype, gemm_dtype) -> None:
        self.state, self.prefix = state, prefix
        self.device, self.dtype, self.gemm_dtype = device, dtype, gemm_dtype

    def get(self, name: str, dtype=None) -> torch.Tensor | None:
        tensor = self.state.get(name, self.state.get(self.prefix + name))
        if tensor is None:
            return None
        return tensor.to(device=self.device, dtype=dtype or self.dtype).contiguous()

    def __call__(self, name: str, dtype=None) -> torch.Tensor:
        tensor = self.get(name, dtype)
        if tensor is None:
            raise KeyError(f"the checkpoint has no {name} (nor {self.prefix}{name})")
        return tensor

    def gemm(self, name: str) -> torch.Tensor:
        """A GEMM's weight, in the GEMM's operand dtype."""
        return self(name, self.gemm_dtype)

    def fp32(self, name: str) -> torch.Tensor:
        return self(name, torch.float32)

    def norm(self, prefix: str, eps: float) -> Norm:
        """A LayerNorm's weight and (if it has one) bias."""
        return Norm(self.fp32(prefix + ".weight"), self.get(prefix + ".bias", torch.float32), eps, self.dtype)

    def has(self, name: str) -> bool:
        return name in self.state or self.prefix + name in self.state
