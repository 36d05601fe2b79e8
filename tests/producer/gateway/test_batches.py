"""Batches over HTTP in tokenq's inline form (``requests``): create, read, list, cancel,
and the error JSONL; answered with OpenAI's batch objects."""

from __future__ import annotations

import orjson

from tests.producer.gateway.conftest import RunningGateway
from tests.producer.gateway.scripted import MODEL


def _lines(n: int) -> list[dict[str, object]]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    return [
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        for i in range(n)
    ]


def test_create_read_list_cancel_and_error_lines(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        created = http.post("/v1/batches", json={"requests": _lines(3), "priority": "low"})
        assert created.status_code == 200, created.text
        batch = created.json()
        assert (batch["priority"], batch["request_counts"]["total"]) == (25, 3)
        assert (batch["object"], batch["endpoint"], batch["input_file_id"]) == (
            "batch",
            "/v1/chat/completions",
            None,
        )
        assert http.get(f"/v1/batches/{batch['id']}").json()["id"] == batch["id"]
        assert batch["id"] in [b["id"] for b in http.get("/v1/batches").json()["data"]]
        cancelled = http.post(f"/v1/batches/{batch['id']}/cancel")
        assert cancelled.status_code == 200
        assert cancelled.json()["status"] in ("cancelling", "cancelled")
        output = http.get(f"/v1/batches/{batch['id']}/output")
        assert output.headers["content-type"] == "application/jsonl"


def test_bad_batches_get_clear_errors(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        bad = http.post("/v1/batches", json={"requests": [{"custom_id": "x", "body": {}}]})
        assert bad.status_code == 400
        assert "line 1" in bad.json()["error"]["message"]
        huge = _lines(2)
        huge[1]["body"] = {**huge[1]["body"], "seed": 2**64}  # type: ignore[dict-item]
        too_big = http.post("/v1/batches", json={"requests": huge})
        assert too_big.status_code == 400, too_big.text
        assert "line 2: Integer exceeds 64-bit range" in too_big.json()["error"]["message"]
        malformed = http.get("/v1/batches/not-a-batch")
        assert malformed.status_code == 400
        assert "malformed batch id" in malformed.json()["error"]["message"]
        missing = http.get("/v1/batches/batch_" + "0" * 24)
        assert missing.status_code == 404
        hooked = {"requests": _lines(1), "webhook_url": "http://127.0.0.1:9/hook"}
        no_secret = http.post("/v1/batches", json=hooked)
        assert no_secret.status_code == 503
        assert "TOKENQ_WEBHOOK_SECRET" in orjson.loads(no_secret.content)["error"]["message"]


def test_a_tenant_sees_and_cancels_only_its_own_batches(keyed_gateway: RunningGateway) -> None:
    web, ops = {"Authorization": "Bearer sk-web"}, {"Authorization": "Bearer sk-ops"}
    with keyed_gateway.client() as http:
        created = http.post("/v1/batches", json={"requests": _lines(1)}, headers=web)
        assert created.status_code == 200, created.text
        batch_id = created.json()["id"]
        assert created.json()["tenant"] == "web"
        others = [
            http.get(f"/v1/batches/{batch_id}", headers=ops),
            http.post(f"/v1/batches/{batch_id}/cancel", headers=ops),
            http.get(f"/v1/batches/{batch_id}/output", headers=ops),
            http.get(f"/v1/batches/{batch_id}/errors", headers=ops),
        ]
        listed_for_ops = http.get("/v1/batches", headers=ops).json()["data"]
        listed_for_web = http.get("/v1/batches", headers=web).json()["data"]
        mine = http.get(f"/v1/batches/{batch_id}", headers=web).json()
    assert [r.status_code for r in others] == [404, 404, 404, 404]
    assert listed_for_ops == []
    assert [b["id"] for b in listed_for_web] == [batch_id]
    assert mine["status"] == "in_progress"  # the other tenant's cancel did nothing
