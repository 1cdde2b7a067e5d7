"""The decode stage: the package's own ``StreamingDetokenizeScheduler``
(``scheduling/streaming_detokenizer.py``), as ``models/qwen3_omni/stages.py:
create_decode_executor`` builds it, with a tokenizer of the synthetic vocabulary."""

from __future__ import annotations

from sglang_omni.proto.request import StagePayload
from sglang_omni.scheduling.streaming_detokenizer import StreamingDetokenizeScheduler


class SyntheticTokenizer:
    """Token ``n`` is the text ``thinker:n `` (omnitrio's synthetic thinker's text)."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        del skip_special_tokens
        return "".join(f"thinker:{token} " for token in token_ids)


def build_result(payload: StagePayload, is_streaming: bool) -> dict[str, object]:
    del is_streaming
    data = payload.data if isinstance(payload.data, dict) else {}
    return {"modality": "text", "num_tokens": data.get("num_tokens", 0)}


def create_decode(model_path: str = "") -> StreamingDetokenizeScheduler:
    del model_path
    return StreamingDetokenizeScheduler(SyntheticTokenizer(), None, build_result=build_result)
