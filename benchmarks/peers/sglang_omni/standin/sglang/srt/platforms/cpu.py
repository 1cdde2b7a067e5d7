"""The CPU platform, the only one this stand-in detects."""

from sglang.srt.platforms.device_mixin import DeviceMixin, PlatformEnum
from sglang.srt.platforms.interface import SRTPlatform


class CpuDeviceMixin(DeviceMixin):
    _enum = PlatformEnum.CPU
    device_name = "cpu"
    device_type = "cpu"


class CpuPlatform(CpuDeviceMixin, SRTPlatform):
    pass
