"""The XPU device mixin by name only: sglang-omni's platform classes import it; this
stand-in never detects XPU (no engine code runs here)."""

from sglang.srt.platforms.device_mixin import DeviceMixin, PlatformEnum


class XpuDeviceMixin(DeviceMixin):
    _enum = PlatformEnum.XPU
    device_name = "xpu"
    device_type = "xpu"
