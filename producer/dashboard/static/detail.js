// One request: its facts, parameters and its token stream, live, with cancel and retry.
import { api, readEvents } from "./api.js";
import { el, seconds } from "./format.js";

const $ = (id) => document.getElementById(id);
const ENDED = new Set(["finished", "failed", "cancelled", "expired", "dead", "gone"]);

export class Detail {
  constructor({ onError, onAction }) {
    this.onError = onError;
    this.onAction = onAction;
    this.controller = null;
    $("close-detail").onclick = () => this.close();
    $("cancel").onclick = () => this.act("cancel");
    $("retry").onclick = () => this.act("retry");
  }

  async open(id) {
    this.close();
    let detail;
    try { detail = await api(`requests/${encodeURIComponent(id)}`); } catch (e) { this.onError(e); return; }
    this.id = id;
    this.ended = false;
    $("detail-id").textContent = id;
    $("detail-tokens").textContent = "";
    $("detail-final").textContent = "";
    this.numTokens = 0;
    this.show(detail);
    $("detail").hidden = false;
    $("detail").scrollIntoView({ block: "nearest" });
    this.follow("0-0");
  }

  close() {
    this.controller?.abort();
    this.controller = null;
    this.id = null;
    $("detail").hidden = true;
  }

  async follow(after) {
    const controller = new AbortController();
    this.controller = controller;
    let cursor = after;
    const onEvent = (type, data, id) => {
      if (id) cursor = id;
      if (type === "status") this.show(data);
      else if (type === "token") this.token(data);
      else if (type === "final") this.final(data);
    };
    while (!controller.signal.aborted && !this.ended) {
      try {
        await readEvents(`requests/${encodeURIComponent(this.id)}/stream?after=${cursor}`, onEvent, controller.signal);
      } catch (e) {
        if (controller.signal.aborted) return;
        if (e.status) { this.onError(e); return; }
      }
      if (!this.ended) await new Promise((r) => setTimeout(r, 1000));
    }
  }

  token(event) {
    $("detail-tokens").append(event.text);
    this.numTokens = event.index + event.token_ids.length;
    $("detail-count").textContent = `${this.numTokens} tokens`;
  }

  final(event) {
    this.ended = true;
    const error = event.error ? ` (${event.error})` : "";
    $("detail-final").textContent = `stream ended: ${event.finish_reason}${error}, ` +
      `${event.usage.completion_tokens} tokens, TTFT ${seconds(event.timings.ttft_s)}, total ${seconds(event.timings.total_s)}`;
    $("detail-final").dataset.finishReason = event.finish_reason;
  }

  show(d) {
    if (d.state === "gone") { this.ended = true; $("detail-final").textContent = "this request has expired"; }
    const state = d.cancel_requested && d.state === "running" ? "cancelling" : d.state;
    $("detail-state").textContent = state;
    $("detail-state").className = `pill ${d.state}`;
    $("cancel").hidden = ENDED.has(d.state);
    $("retry").hidden = d.state !== "dead";
    if (d.state === "gone") return;
    facts(d);
    $("detail-params").textContent = JSON.stringify(
      { prompt: d.prompt ?? undefined, messages: d.messages ?? undefined, ...d.parameters,
        prompt_truncated: d.prompt_truncated || undefined }, null, 2);
  }

  async act(action) {
    try {
      const reply = await api(`requests/${encodeURIComponent(this.id)}/${action}`, { method: "POST" });
      this.onAction(`${action} ${this.id}: ${reply.result}`);
      if (action === "retry") this.open(this.id);
    } catch (e) { this.onError(e); }
  }
}

function facts(d) {
  const t = (ms) => (ms == null ? "–" : new Date(ms).toLocaleTimeString());
  const since = (ms) => (ms == null || d.created_ms == null ? "" : ` (+${seconds((ms - d.created_ms) / 1000)})`);
  const rows = [
    ["model", d.model], ["priority", `${d.priority_name} (${d.priority})`], ["attempts", d.attempts],
    ["worker", d.worker || "–"], ["queue position", d.position ?? "–"], ["generated", d.num_generated],
    ["created", t(d.created_ms)], ["started", t(d.started_ms) + since(d.started_ms)],
    ["first token", t(d.first_token_ms) + since(d.first_token_ms)],
    ["finished", t(d.finished_ms) + since(d.finished_ms)],
    ["deadline", t(d.deadline_ms)], ["finish reason", d.finish_reason || "–"],
  ];
  if (d.dead_reason) rows.push(["dead reason", d.dead_reason]);
  $("detail-facts").tBodies[0].replaceChildren(...rows.map(([k, v]) => el("tr", {}, el("td", {}, k), el("td", {}, v))));
}
