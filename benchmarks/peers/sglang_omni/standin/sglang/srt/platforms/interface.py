"""``SRTPlatform``: the base sglang-omni checks an out-of-tree platform against (stand-in)."""

from sglang.srt.platforms.device_mixin import DeviceMixin


class SRTPlatform(DeviceMixin):
    pass
