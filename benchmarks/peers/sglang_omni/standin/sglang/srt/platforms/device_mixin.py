"""``DeviceMixin`` and ``PlatformEnum`` as sglang-omni's platform classes use them (stand-in)."""

from __future__ import annotations

import enum
import os
import random


class PlatformEnum(enum.Enum):
    CUDA = enum.auto()
    ROCM = enum.auto()
    CPU = enum.auto()
    XPU = enum.auto()
    NPU = enum.auto()
    MPS = enum.auto()
    MUSA = enum.auto()
    OOT = enum.auto()


class DeviceMixin:
    """What the runtime asks of a platform: its kind, its device and a few host calls."""

    _enum: PlatformEnum = PlatformEnum.CPU
    device_name: str = "cpu"
    device_type: str = "cpu"

    def is_cuda(self) -> bool:
        return self._enum is PlatformEnum.CUDA

    def is_rocm(self) -> bool:
        return self._enum is PlatformEnum.ROCM

    def is_cuda_alike(self) -> bool:
        return self._enum in (PlatformEnum.CUDA, PlatformEnum.ROCM)

    def is_cpu(self) -> bool:
        return self._enum is PlatformEnum.CPU

    def is_xpu(self) -> bool:
        return self._enum is PlatformEnum.XPU

    def is_npu(self) -> bool:
        return self._enum is PlatformEnum.NPU

    def is_mps(self) -> bool:
        return self._enum is PlatformEnum.MPS

    def is_musa(self) -> bool:
        return self._enum is PlatformEnum.MUSA

    def is_out_of_tree(self) -> bool:
        return self._enum is PlatformEnum.OOT

    def get_device(self, index: int = 0) -> object:
        import torch

        return torch.device(self.device_type)

    def set_device(self, device: object) -> None:
        del device

    def synchronize(self, device: object = None) -> None:
        del device

    def empty_cache(self) -> None:
        pass

    def get_available_memory(self, device: object = None) -> int:
        del device
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))

    def seed_everything(self, seed: int | None) -> None:
        if seed is None:
            return
        import numpy
        import torch

        random.seed(seed)
        numpy.random.seed(seed)
        torch.manual_seed(seed)

    def get_device_count(self) -> int:
        return 1
