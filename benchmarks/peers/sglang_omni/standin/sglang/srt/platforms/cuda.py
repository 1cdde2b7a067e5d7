"""The CUDA device mixin by name only: sglang-omni's platform classes import it; this
stand-in never detects CUDA (no engine code runs here)."""

from sglang.srt.platforms.device_mixin import DeviceMixin, PlatformEnum


class CudaDeviceMixin(DeviceMixin):
    _enum = PlatformEnum.CUDA
    device_name = "cuda"
    device_type = "cuda"
