// The queues, workers and requests tables, redrawn from each overview.
import { ago, bar, el, fill, num, percent, seconds } from "./format.js";

const short = (id) => (id && id.length > 18 ? `${id.slice(0, 8)}…${id.slice(-6)}` : id || "–");

export function renderQueues(tbody, queues, { canAct, onPause }) {
  const rows = [];
  for (const q of queues) {
    const bands = q.priorities.length ? q.priorities : [{ name: "–", depth: 0, oldest_age_s: null }];
    bands.forEach((band, i) => rows.push(queueRow(q, band, i === 0, canAct, onPause)));
  }
  fill(tbody, rows, 10, "no models yet: start a worker");
}

function queueRow(q, band, first, canAct, onPause) {
  const perModel = (value) => (first ? value : "");
  const toggle = el("button", { class: "act", disabled: !canAct, textContent: q.paused ? "Resume" : "Pause",
    onclick: () => onPause(q, !q.paused) });
  return el("tr", { "data-model": q.model, "data-priority": band.name },
    el("td", {}, perModel(q.model)), el("td", {}, band.name),
    el("td", { class: "num" }, band.depth), el("td", { class: "num" }, seconds(band.oldest_age_s)),
    el("td", { class: "num" }, perModel(q.running)), el("td", { class: "num" }, perModel(q.dead)),
    el("td", { class: "num" }, perModel(num(q.rate_in_per_s, 2))),
    el("td", { class: "num" }, perModel(num(q.rate_out_per_s, 2))),
    el("td", {}, first ? el("span", { class: `pill ${q.paused ? "readonly" : "ok"}` }, q.paused ? "paused" : "active") : ""),
    el("td", {}, first ? toggle : ""));
}

export function renderWorkers(tbody, workers, nowMs, { canAct, onDrain }) {
  const rows = workers.map((w) => {
    const drain = el("button", { class: "act", disabled: !canAct || !w.alive || w.state !== "serving",
      textContent: "Drain", onclick: () => onDrain(w) });
    const batch = w.max_num_seqs ? bar(w.occupancy, `${w.running}/${w.max_num_seqs}`) : "–";
    const engine = [w.waiting ? `${w.waiting} waiting` : "", w.preemptions ? `${w.preemptions} preempted` : "",
      w.spec_acceptance_rate == null ? "" : `drafts kept ${percent(w.spec_acceptance_rate)}`].filter(Boolean).join(", ");
    const load = el("span", { title: "Requests in its batch; waiting in the engine's own scheduler; preemptions since it started; share of speculative draft tokens kept" },
      batch, engine ? el("small", {}, ` ${engine}`) : "");
    const kvBar = w.kv_cache_usage == null ? "–" : bar(w.kv_cache_usage, percent(w.kv_cache_usage));
    const affinity = w.affinity_claims == null ? "" : `, ${w.affinity_claims} claimed warm`;
    const hits = w.prefix_cache_hit_rate == null ? "" : `prefix hits ${percent(w.prefix_cache_hit_rate)}${affinity}`;
    const kv = el("span", { title: "KV cache in use; share of prompt tokens found in the prefix cache; requests claimed for a prefix it held warm" },
      kvBar, hits ? el("small", {}, ` ${hits}`) : "");
    return el("tr", { class: w.alive ? "" : "dead", "data-worker": w.id },
      el("td", { class: "mono", title: w.id }, short(w.id)), el("td", {}, w.model || "–"),
      el("td", {}, w.device || "–"),
      el("td", {}, el("span", { class: `pill ${w.alive ? w.state : "dead"}` }, w.alive ? w.state : "dead")),
      el("td", {}, load), el("td", {}, kv), el("td", { class: "num" }, num(w.tokens_per_s)),
      el("td", { class: "num" }, w.alive ? w.running : "–"), el("td", {}, w.version || "–"),
      el("td", {}, ago(w.last_heartbeat_ms, nowMs)), el("td", {}, drain));
  });
  fill(tbody, rows, 11, "no live or recently dead workers");
}

export function renderRequests(tbody, rows, nowMs, onOpen) {
  const trs = rows.map((r) => el("tr", { class: "clickable", "data-id": r.id, onclick: () => onOpen(r.id) },
    el("td", { class: "mono", title: r.id }, r.id), el("td", {}, r.model), el("td", {}, r.tenant || "–"),
    el("td", {}, el("span", { class: `pill ${r.state}` }, r.cancel_requested && r.state === "running" ? "cancelling" : r.state)),
    el("td", {}, r.priority_name), el("td", { class: "num" }, r.attempts),
    el("td", { class: "num" }, r.num_generated), el("td", { class: "mono", title: r.worker || "" }, short(r.worker)),
    el("td", {}, ago(r.created_ms, nowMs)), el("td", { class: "num" }, seconds(r.ttft_s)),
    el("td", {}, r.dead_reason || r.finish_reason || "")));
  fill(tbody, trs, 11, "none");
}

export function renderBatches(tbody, batches, nowMs, { canAct, onCancel }) {
  const rows = batches.map((b) => {
    const live = b.state === "in_progress";
    const cancel = el("button", { class: "act danger", disabled: !canAct || !live, textContent: "Cancel",
      onclick: () => onCancel(b) });
    return el("tr", { "data-batch": b.id },
      el("td", { class: "mono", title: b.id }, short(b.id)), el("td", {}, b.tenant || "–"),
      el("td", {}, el("span", { class: `pill ${b.state}` }, b.state)),
      el("td", { class: "progress" }, bar(b.progress, `${b.done}/${b.total}`)),
      el("td", { class: "num" }, b.completed), el("td", { class: "num" }, b.failed),
      el("td", { class: "num" }, b.in_flight), el("td", { class: "num" }, b.priority),
      el("td", {}, ago(b.created_ms, nowMs)), el("td", {}, cancel));
  });
  fill(tbody, rows, 10, "no batches");
}

export function renderUsage(tbody, usage) {
  const rows = usage.map((u) => el("tr", { "data-tenant": u.tenant },
    el("td", {}, u.tenant), el("td", { class: "num" }, u.prompt_tokens),
    el("td", { class: "num" }, u.completion_tokens), el("td", { class: "num" }, u.total_tokens),
    el("td", { class: "num" }, u.requests),
    el("td", { class: "num", title: `${u.cache_hit_tokens} of ${u.cache_queried_tokens} looked-up prompt tokens` },
      u.cache_queried_tokens ? percent(u.cache_hit_rate) : "–")));
  fill(tbody, rows, 6, "no usage in the last 24 hours");
}
