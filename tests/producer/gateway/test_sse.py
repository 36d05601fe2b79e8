from __future__ import annotations

from producer.gateway.sse import frame


def test_frames_carry_id_event_and_data() -> None:
    assert (
        frame(b'{"a":1}', event_id="1-0", event="token")
        == b'id: 1-0\nevent: token\ndata: {"a":1}\n\n'
    )
    assert frame("[DONE]") == b"data: [DONE]\n\n"
