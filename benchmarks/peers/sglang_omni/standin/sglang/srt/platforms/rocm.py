"""The ROCM device mixin by name only: sglang-omni's platform classes import it; this
stand-in never detects ROCM (no engine code runs here)."""

from sglang.srt.platforms.device_mixin import DeviceMixin, PlatformEnum


class RocmDeviceMixin(DeviceMixin):
    _enum = PlatformEnum.ROCM
    device_name = "cuda"
    device_type = "cuda"
